package controlplane

import (
	"errors"
	"fmt"
	"io"
	"os"

	"go.yaml.in/yaml/v3"
)

// DecodeConfig reads a control node's YAML configuration file (plan §2)
// over cfg: keys are the flags' names with underscores (grpc_addr,
// heartbeat_timeout: 500ms, ...), keys it leaves out keep cfg's values, and
// an unknown key is an error rather than a silently ignored typo. It does
// not validate: flags may still override, then Validate runs once.
func DecodeConfig(r io.Reader, cfg *Config) error {
	dec := yaml.NewDecoder(r)
	dec.KnownFields(true)
	next := *cfg
	if err := dec.Decode(&next); err != nil {
		if errors.Is(err, io.EOF) {
			return nil // an empty file changes nothing
		}
		return fmt.Errorf("decode control config: %w", err)
	}
	var extra yaml.Node
	if err := dec.Decode(&extra); !errors.Is(err, io.EOF) {
		return errors.New("decode control config: more than one YAML document")
	}
	*cfg = next
	return nil
}

// LoadConfigFile is DecodeConfig on the named file.
func LoadConfigFile(path string, cfg *Config) error {
	f, err := os.Open(path)
	if err != nil {
		return fmt.Errorf("--config: %w", err)
	}
	defer f.Close()
	if err := DecodeConfig(f, cfg); err != nil {
		return fmt.Errorf("--config %s: %w", path, err)
	}
	return nil
}
