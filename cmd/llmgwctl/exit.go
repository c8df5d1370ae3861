package main

import (
	"errors"
	"fmt"
	"io"
	"strings"

	"github.com/spf13/cobra"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// llmgwctl's exit statuses, so a script can tell what to do next without
// reading the message: retry (unavailable), check first (outcome unknown),
// or stop (the rest). exitHelp says them in `llmgwctl --help`.
const (
	exitOK = 0
	// exitError is any other failure: the server refused the request
	// (invalid, conflicting, not permitted) or a local file could not be
	// read or written.
	exitError = 1
	// exitUsage is a command line llmgwctl cannot run: an unknown command
	// or flag, a wrong number of arguments, a bad flag value.
	exitUsage = 2
	// exitNotFound is a request naming what the cluster does not hold: a
	// model, node, replica, API key, tenant, adapter or Raft peer.
	exitNotFound = 3
	// exitUnavailable is a request nothing was done for, so safe to retry:
	// no server answers at --addr, or the cluster has no leader (a quorum
	// of voters is down or cut off, or an election is under way).
	exitUnavailable = 4
	// exitUnknown is a request whose outcome is not known: it timed out,
	// or the leader lost office while committing it. A write may or may
	// not have been applied: look before retrying it.
	exitUnknown = 5
)

const exitHelp = `Exit status:
  0  success
  1  error: the request was refused (invalid, conflicting, not permitted), or a local file failed
  2  usage: unknown command or flag, wrong arguments, bad flag value
  3  not found: the model, node, API key, tenant, adapter or peer named does not exist
  4  unavailable, nothing done, safe to retry: no server answers at --addr, or the cluster has no leader
  5  outcome unknown: timed out, or leadership was lost mid-write; a write may have been applied

Reads are answered by the server at --addr from its own copy, which may lag
the leader by a few milliseconds; --consistent on a list command has the
leader answer after confirming its leadership with a quorum.`

// exitCode is the exit status for the error a command returned.
func exitCode(err error) int {
	if err == nil {
		return exitOK
	}
	var ue *usageError
	if errors.As(err, &ue) {
		return exitUsage
	}
	if code, ok := grpcCode(err); ok {
		switch code {
		case codes.NotFound:
			return exitNotFound
		case codes.Unavailable:
			return exitUnavailable
		case codes.DeadlineExceeded, codes.Aborted:
			return exitUnknown
		}
		return exitError
	}
	// cobra's own refusals that reach no hook of ours.
	if msg := err.Error(); strings.HasPrefix(msg, "required flag") || strings.HasPrefix(msg, "unknown command") {
		return exitUsage
	}
	return exitError
}

// grpcCode is the gRPC code of the status err carries, if any.
func grpcCode(err error) (codes.Code, bool) {
	var ce *callError
	if errors.As(err, &ce) {
		return ce.code, true
	}
	var se interface{ GRPCStatus() *status.Status }
	if errors.As(err, &se) {
		return se.GRPCStatus().Code(), true
	}
	return codes.OK, false
}

// callError is a failed call as an operator reads it: the command's words
// around the server's message, the code kept for the exit status.
type callError struct {
	code codes.Code
	msg  string
	// status is the status's own message, without the command's words.
	status string
}

func (e *callError) Error() string { return e.msg }

// usageError is a command line llmgwctl refuses before calling anyone.
type usageError struct{ err error }

func (e *usageError) Error() string { return e.err.Error() }
func (e *usageError) Unwrap() error { return e.err }

// usage marks err as a usage error (exit status 2).
func usage(err error) error {
	if err == nil {
		return nil
	}
	return &usageError{err: err}
}

// suggestDistance is the edit distance within which an unknown command's
// name suggests a real one: `modl`, `models`, `clustr`, `lst` and `modle`
// are each one edit away (a swap of neighbours is one edit).
const suggestDistance = 2

// suggestions are the subcommands of cmd an operator most likely meant by
// arg: those arg is a prefix of, else the nearest within suggestDistance
// edits (all of them when several are as near). cobra's SuggestionsFor
// has a minimum distance of 0 in a command it does not run itself, which
// leaves prefixes only, and lists every command within its distance, so
// `modl` would read "model, node".
func suggestions(cmd *cobra.Command, arg string) []string {
	arg = strings.ToLower(arg)
	var prefixed, nearest []string
	best := suggestDistance + 1
	for _, sub := range cmd.Commands() {
		if !sub.IsAvailableCommand() {
			continue
		}
		name := sub.Name()
		if strings.HasPrefix(name, arg) {
			prefixed = append(prefixed, name)
			continue
		}
		d := editDistance(arg, name)
		for _, s := range sub.SuggestFor {
			d = min(d, editDistance(arg, strings.ToLower(s)))
		}
		switch {
		case d < best:
			best, nearest = d, []string{name}
		case d == best:
			nearest = append(nearest, name)
		}
	}
	if len(prefixed) > 0 {
		return prefixed
	}
	return nearest
}

// editDistance is the optimal string alignment distance between a and b:
// insertions, deletions, substitutions and swaps of neighbours, one edit
// each.
func editDistance(a, b string) int {
	ra, rb := []rune(a), []rune(b)
	// d[i][j] is the distance between ra[:i] and rb[:j].
	d := make([][]int, len(ra)+1)
	for i := range d {
		d[i] = make([]int, len(rb)+1)
		d[i][0] = i
	}
	for j := range d[0] {
		d[0][j] = j
	}
	for i := 1; i <= len(ra); i++ {
		for j := 1; j <= len(rb); j++ {
			cost := 1
			if ra[i-1] == rb[j-1] {
				cost = 0
			}
			d[i][j] = min(d[i-1][j]+1, d[i][j-1]+1, d[i-1][j-1]+cost)
			if i > 1 && j > 1 && ra[i-1] == rb[j-2] && ra[i-2] == rb[j-1] {
				d[i][j] = min(d[i][j], d[i-2][j-2]+1)
			}
		}
	}
	return d[len(ra)][len(rb)]
}

// wireUsage makes every refusal of a command line a usageError: a bad
// flag, wrong arguments, an unknown subcommand. cobra shows a command
// group's help, exit status 0, for `model lis`; here it is an error, with
// the commands within suggestDistance edits of the word suggested.
func wireUsage(root *cobra.Command) {
	root.SetFlagErrorFunc(func(_ *cobra.Command, err error) error { return usage(err) })
	var walk func(*cobra.Command)
	walk = func(cmd *cobra.Command) {
		if args := cmd.Args; args != nil {
			cmd.Args = func(cmd *cobra.Command, a []string) error { return usage(args(cmd, a)) }
		}
		if !cmd.Runnable() && cmd.HasSubCommands() {
			cmd.Args = cobra.ArbitraryArgs
			cmd.RunE = func(cmd *cobra.Command, args []string) error {
				if len(args) == 0 {
					return cmd.Help()
				}
				msg := fmt.Sprintf("unknown command %q for %q", args[0], cmd.CommandPath())
				if s := suggestions(cmd, args[0]); len(s) > 0 {
					msg += fmt.Sprintf(" (did you mean %s?)", strings.Join(s, ", "))
				}
				return usage(errors.New(msg))
			}
		}
		for _, sub := range cmd.Commands() {
			walk(sub)
		}
	}
	walk(root)
}

// execute runs llmgwctl with args, writes any error to stderr and returns
// the exit status.
func execute(args []string, stdout, stderr io.Writer) int {
	root := newRootCmd(stdout)
	root.SetArgs(args)
	root.SetOut(stdout)
	root.SetErr(stderr)
	cmd, err := root.ExecuteC()
	if err == nil {
		return exitOK
	}
	code := exitCode(err)
	fmt.Fprintln(stderr, "llmgwctl:", err)
	if code == exitUsage {
		fmt.Fprintf(stderr, "see '%s --help'\n", cmd.CommandPath())
	}
	return code
}
