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
	"strings"

	"go.yaml.in/yaml/v3"
)

// MaxSize bounds a configuration file: it is read whole before decoding, and
// no real configuration comes near it.
const MaxSize = 1 << 20

// Decode reads one YAML document from r over *cfg: keys it leaves out keep
// cfg's values (a map in the file is merged into a map cfg already holds),
// an unknown key, a value of the wrong type, a second document or a file
// over MaxSize is an error, and an empty document changes nothing. Errors
// about a value name its key path ("gossip.reconnect_interval: line 4:
// ..."; Strict). On error *cfg is left as it was: the document is first
// decoded into a zero value of cfg's type, and only a document that decodes
// cleanly is decoded again over cfg. It does not validate: flags may still
// override, then the caller validates once.
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
	if err := Strict(b, reflect.New(v.Elem().Type()).Interface()); err != nil {
		if errors.Is(err, ErrEmpty) {
			return nil // an empty file changes nothing
		}
		return err
	}
	return Strict(b, cfg)
}

var (
	// ErrEmpty is Strict's error for a document with no content.
	ErrEmpty = errors.New("empty YAML document")
	// ErrSecondDocument is Strict's error for more than one document.
	ErrSecondDocument = errors.New("more than one YAML document")
)

// Strict decodes the single YAML document of b into target (a non-nil
// pointer) strictly: an unknown key is an error that starts with its key
// path ("autoscale.target: line 5: unknown key"), a value of the wrong type
// is an error that starts with its key path ("heartbeat_timeout: line 3:
// cannot unmarshal !!seq into time.Duration"), and so is a number with a
// fraction or an exponent where the setting is an integer, which yaml.v3
// would truncate (replicas: 1.5 is not 1). Every such problem is reported,
// one per line. It returns ErrEmpty for an empty document and
// ErrSecondDocument for more than one; b is not size-checked (Decode is).
// On error target may hold part of the document.
func Strict(b []byte, target any) error {
	dec := yaml.NewDecoder(bytes.NewReader(b))
	dec.KnownFields(true)
	err := dec.Decode(target)
	if errors.Is(err, io.EOF) {
		return ErrEmpty
	}
	var te *yaml.TypeError
	if err == nil || errors.As(err, &te) {
		// A type error does not stop the decoder; anything else (not
		// YAML, a type's own refusal) stops it where it is.
		var extra yaml.Node
		if err := dec.Decode(&extra); !errors.Is(err, io.EOF) {
			return ErrSecondDocument
		}
	}
	var doc yaml.Node
	if perr := yaml.Unmarshal(b, &doc); perr != nil {
		return err // not YAML: the decoder's error says where
	}
	problems, lines := keyProblems(&doc, reflect.TypeOf(target))
	if te != nil {
		// Keep what the walk did not name: duplicate keys, and a type
		// error or unknown key it could not place (inside an alias).
		for _, e := range te.Errors {
			var line int
			if _, serr := fmt.Sscanf(e, "line %d:", &line); serr == nil && lines[line] &&
				(strings.Contains(e, "cannot unmarshal") || strings.Contains(e, " not found in type ")) {
				continue
			}
			problems = append(problems, e)
		}
	}
	if len(problems) == 0 {
		return err
	}
	return errors.New(strings.Join(problems, "\n"))
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
