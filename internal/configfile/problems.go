package configfile

import (
	"errors"
	"fmt"
	"strings"
)

// Flag names a setting that has a flag the way the user may have written
// it, as a problem reported by a Validate starts: the flag, and in
// parentheses its file key, which is the flag's name with underscores:
// Flag("heartbeat-timeout") is "--heartbeat-timeout (heartbeat_timeout)".
// A setting only the file sets is named by its key alone ("drain_timeout").
func Flag(name string) string {
	return FlagKey(name, strings.ReplaceAll(name, "-", "_"))
}

// FlagKey is Flag for a setting whose file key is not its flag's name with
// underscores: FlagKey("label", "labels") is "--label (labels)".
func FlagKey(flag, key string) string {
	return "--" + flag + " (" + key + ")"
}

// Problems collects what is wrong with a configuration, so that its
// Validate reports every problem at once and an operator fixes the file
// and flags in one pass rather than one error per start. Each problem is
// one line that starts with the setting it is about (Flag, FlagKey or a
// file key), so the user finds it whichever way it was given. The zero
// value is empty and ready to use.
type Problems struct {
	errs []error
}

// Add records the problem "<setting>: <message>", the message formatted as
// fmt.Errorf does: %w wraps a cause, which errors.Is and errors.As then
// still find through Err. go vet checks the format like fmt.Errorf's.
func (p *Problems) Add(setting, format string, args ...any) {
	p.errs = append(p.errs, fmt.Errorf("%s: %w", setting, fmt.Errorf(format, args...)))
}

// Join records the problems of nested Validates (a component's own
// configuration, whose errors already name its keys); nil errors, a valid
// component's, are skipped.
func (p *Problems) Join(errs ...error) {
	for _, err := range errs {
		if err != nil {
			p.errs = append(p.errs, err)
		}
	}
}

// Err is every problem recorded, joined with errors.Join (one per line, in
// the order they were recorded), or nil when there is none.
func (p *Problems) Err() error {
	return errors.Join(p.errs...)
}
