// Package configfile reads a server role's YAML configuration file and
// collects the problems its Validate finds.
//
// Every server role (control, agent, router) takes --config (design §2):
// the defaults, then the file, then the flags given on the command line, in
// that order of precedence. The file is decoded strictly: an unknown key is
// an error rather than a silently ignored typo, which is how a misspelt
// setting would otherwise reach production unnoticed.
//
// Every role's Validate reports through Problems: every problem at once,
// each naming the setting as the user wrote it (Flag, FlagKey, or the key).
//
// It is the one internal leaf that imports a module beyond the standard
// library: the project's single YAML library, go.yaml.in/yaml/v3.
package configfile

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"reflect"

	"go.yaml.in/yaml/v3"
)

// MaxSize bounds a configuration file: it is read whole before decoding, and
// no real configuration comes near it.
const MaxSize = 1 << 20

// Decode reads one YAML document from r over *cfg: keys it leaves out keep
// cfg's values (a map in the file is merged into a map cfg already holds),
// an unknown key, a second document or a file over MaxSize is an error, and
// an empty document changes nothing. On error *cfg is left as it was: the
// document is first decoded into a zero value of cfg's type, and only a
// document that decodes cleanly is decoded again over cfg. It does not
// validate: flags may still override, then the caller validates once.
func Decode(r io.Reader, cfg any) error {
	v := reflect.ValueOf(cfg)
	if v.Kind() != reflect.Pointer || v.IsNil() {
		return fmt.Errorf("configfile: decode target must be a non-nil pointer, got %T", cfg)
	}
	b, err := io.ReadAll(io.LimitReader(r, MaxSize+1))
	if err != nil {
		return err
	}
	if len(b) > MaxSize {
		return fmt.Errorf("larger than %d bytes", MaxSize)
	}
	if err := decodeOne(b, reflect.New(v.Elem().Type()).Interface()); err != nil {
		return err
	}
	return decodeOne(b, cfg)
}

// decodeOne decodes the single document of b strictly into target.
func decodeOne(b []byte, target any) error {
	dec := yaml.NewDecoder(bytes.NewReader(b))
	dec.KnownFields(true)
	if err := dec.Decode(target); err != nil {
		if errors.Is(err, io.EOF) {
			return nil // an empty file changes nothing
		}
		return err
	}
	var extra yaml.Node
	if err := dec.Decode(&extra); !errors.Is(err, io.EOF) {
		return errors.New("more than one YAML document")
	}
	return nil
}

// Load is Decode on the named file; its errors name the file and --config.
func Load(path string, cfg any) error {
	f, err := os.Open(path)
	if err != nil {
		return fmt.Errorf("--config: %w", err)
	}
	defer f.Close()
	if err := Decode(f, cfg); err != nil {
		return fmt.Errorf("--config %s: %w", path, err)
	}
	return nil
}
