package fsm

import (
	"errors"
	"fmt"

	llmgwv1 "github.com/llmgw/llmgw/proto/llmgw/v1"
)

// ValidationError says which field of a model (in the model file's YAML
// spelling, e.g. "adapters[1].name") is wrong and why. Callers match it with
// errors.As to turn it into INVALID_ARGUMENT or a CLI message.
type ValidationError struct {
	Field  string
	Reason string
}

func (e *ValidationError) Error() string { return e.Field + ": " + e.Reason }

func invalid(field, format string, args ...any) *ValidationError {
	return &ValidationError{Field: field, Reason: fmt.Sprintf(format, args...)}
}

var (
	// ErrNotFound means a command named an object the state does not hold.
	ErrNotFound = errors.New("not found")
	// ErrConflict means a command contradicts the state (a GPU given twice,
	// an adapter name another model already uses).
	ErrConflict = errors.New("conflict")
	// ErrMalformed means an entry's bytes do not decode. Every node decodes
	// the same bytes the same way, so this rejects the entry without risk of
	// divergence; it points at a bug in the proposer.
	ErrMalformed = errors.New("malformed command")
	// ErrUnknownCommand means a non-ignorable command of a type or version
	// this build does not know. Skipping it could make this node diverge from
	// newer ones, so the raft adapter stops the node loudly instead (design §4).
	ErrUnknownCommand = errors.New("unknown command")
)

// UnknownCommandError carries the type and version that could not be applied.
type UnknownCommandError struct {
	Type    llmgwv1.CommandType
	Version uint32
}

func (e *UnknownCommandError) Error() string {
	return fmt.Sprintf("unknown command: type %d version %d is not known to this build; upgrade this server", int32(e.Type), e.Version)
}

func (e *UnknownCommandError) Is(target error) bool { return target == ErrUnknownCommand }

// IsFatal reports whether an Apply error must stop the node rather than be
// returned to the proposer.
func IsFatal(err error) bool { return errors.Is(err, ErrUnknownCommand) }
