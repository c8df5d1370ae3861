// Package configfile reads a server role's YAML configuration file.
//
// Every server role (control, agent, router) takes --config (design §2):
// the defaults, then the file, then the flags given on the command line, in
// that order of precedence. The file is decoded strictly: an unknown key is
// an error rather than a silently ignored typo, which is how a misspelt
// setting would otherwise reach production unnoticed.
//
// It is the one internal leaf that imports a module beyond the standard
// library: the project's single YAML library, go.yaml.in/yaml/v3.
package configfile

import (
	"errors"
	"fmt"
	"io"
	"os"
	"reflect"

	"go.yaml.in/yaml/v3"
)

// Decode reads one YAML document from r over *cfg: keys it leaves out keep
// cfg's values, an unknown key or a second document is an error, and an
// empty document changes nothing. On error *cfg is left as it was. It does
// not validate: flags may still override, then the caller validates once.
func Decode(r io.Reader, cfg any) error {
	dec := yaml.NewDecoder(r)
	dec.KnownFields(true)
	// Decode into a copy so a half-read file loses nothing of cfg.
	tmp, restore, err := shadow(cfg)
	if err != nil {
		return err
	}
	if err := dec.Decode(tmp); err != nil {
		if errors.Is(err, io.EOF) {
			return nil
		}
		return err
	}
	var extra yaml.Node
	if err := dec.Decode(&extra); !errors.Is(err, io.EOF) {
		return errors.New("more than one YAML document")
	}
	restore()
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

// shadow returns a pointer to a copy of *cfg and a function that copies it
// back over *cfg.
func shadow(cfg any) (tmp any, commit func(), err error) {
	v := reflect.ValueOf(cfg)
	if v.Kind() != reflect.Pointer || v.IsNil() {
		return nil, nil, fmt.Errorf("configfile: decode target must be a non-nil pointer, got %T", cfg)
	}
	cp := reflect.New(v.Elem().Type())
	cp.Elem().Set(v.Elem())
	return cp.Interface(), func() { v.Elem().Set(cp.Elem()) }, nil
}
