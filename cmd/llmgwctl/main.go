// Command llmgwctl is the operator's CLI (design §2, §5.2): it talks to any
// control-plane server through AdminService. This package is wiring only.
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/llmgw/llmgw/internal/mtls"
	llmgwv1 "github.com/llmgw/llmgw/proto/llmgw/v1"
)

var version = "dev"

// defaultAddr is where `llmgw dev` serves the control plane's gRPC.
const defaultAddr = "127.0.0.1:7400"

// cli carries what every command shares: where to connect and with which
// certificate, how to print, and where output goes (so tests can capture
// it).
type cli struct {
	addr    string
	tls     mtls.Files
	output  string
	timeout time.Duration
	out     io.Writer
}

func main() {
	os.Exit(execute(os.Args[1:], os.Stdout, os.Stderr))
}

func newRootCmd(out io.Writer) *cobra.Command {
	c := &cli{out: out}
	root := &cobra.Command{
		Use:           "llmgwctl",
		Short:         "Operate an llmgw cluster: models, nodes, replicas, servers",
		Long:          "Operate an llmgw cluster: models, nodes, replicas, servers.\n\n" + exitHelp,
		Version:       version,
		SilenceUsage:  true,
		SilenceErrors: true,
		PersistentPreRunE: func(*cobra.Command, []string) error {
			if m := c.tls.Missing(); len(m) > 0 {
				return usage(fmt.Errorf("--%s: required when any of --tls-ca, --tls-cert, --tls-key is given", m[0]))
			}
			switch c.output {
			case "table", "json":
				return nil
			default:
				return usage(fmt.Errorf("-o: %q is neither table nor json", c.output))
			}
		},
	}
	addr := os.Getenv("LLMGW_ADDR")
	if addr == "" {
		addr = defaultAddr
	}
	root.PersistentFlags().StringVar(&c.addr, "addr", addr, "a control-plane server's gRPC address (env LLMGW_ADDR)")
	pf := root.PersistentFlags()
	pf.StringVar(&c.tls.CA, "tls-ca", os.Getenv("LLMGW_TLS_CA"), "CA certificate the server's certificate must chain to (env LLMGW_TLS_CA); with --tls-cert and --tls-key, mutual TLS")
	pf.StringVar(&c.tls.Cert, "tls-cert", os.Getenv("LLMGW_TLS_CERT"), "this client's certificate, normally an admin's (env LLMGW_TLS_CERT)")
	pf.StringVar(&c.tls.Key, "tls-key", os.Getenv("LLMGW_TLS_KEY"), "the key of --tls-cert (env LLMGW_TLS_KEY)")
	root.PersistentFlags().StringVarP(&c.output, "output", "o", "table", "output format: table or json")
	root.PersistentFlags().DurationVar(&c.timeout, "timeout", 10*time.Second, "how long one call may take")
	node := c.nodeCmd()
	node.AddCommand(c.nodeLabelCmd())
	root.AddCommand(c.modelCmd(), node, c.replicaCmd(), c.clusterCmd(), c.benchCmd(),
		c.joinCmd(), c.leaveCmd(), c.serverCmd(), c.raftCmd(), c.snapshotCmd(), c.upgradeCmd(), c.tlsCmd())
	root.AddCommand(c.apikeyCmd(), c.tenantCmd(), c.usageCmd(), c.flowCmd(), c.keyringCmd(), c.aliasCmd())
	wireUsage(root)
	c.wireCompletion(root)
	return root
}

// admin dials the server and runs fn with a client and a context bounded by
// --timeout. The connection lives for one call: llmgwctl is short-lived.
func (c *cli) admin(ctx context.Context, fn func(context.Context, llmgwv1.AdminServiceClient) error) error {
	creds, err := c.credentials()
	if err != nil {
		return err
	}
	conn, err := grpc.NewClient(c.addr, creds)
	if err != nil {
		return fmt.Errorf("connect to %s: %w", c.addr, err)
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(ctx, c.timeout)
	defer cancel()
	err = plainError(fn(ctx, llmgwv1.NewAdminServiceClient(conn)))
	return c.hintTimeout(ctx, c.hintUnreachable(c.hintTLS(err)))
}

// hintTimeout says what gRPC's "context deadline exceeded" means when it is
// --timeout that passed: no answer, and so no knowing whether a write was
// applied. gRPC words it either way: "context deadline exceeded" when the
// client's timer fired first, "stream terminated by RST_STREAM with error
// code: CANCEL" when the server's copy of the deadline did; both carry
// DEADLINE_EXCEEDED once the deadline is behind us.
func (c *cli) hintTimeout(ctx context.Context, err error) error {
	if code, _ := grpcCode(err); code != codes.DeadlineExceeded || !deadlinePassed(ctx) {
		return err
	}
	return fmt.Errorf("%w: %s did not answer within --timeout %v; a write may or may not have been applied", err, c.addr, c.timeout)
}

// deadlinePassed reports whether ctx's deadline is behind us. It reads the
// clock rather than ctx.Err(): the server, which enforces the same deadline
// from the call's grpc-timeout, may answer DEADLINE_EXCEEDED before the
// client's own timer has fired on a loaded machine.
func deadlinePassed(ctx context.Context) bool {
	if ctx.Err() != nil {
		return true
	}
	dl, ok := ctx.Deadline()
	return ok && !time.Now().Before(dl)
}

// hintUnreachable says what gRPC's own "connection error: desc =
// transport: Error while dialing ..." means: nothing answers at --addr.
// A server's message that quotes one (it cannot reach the leader) is not
// that.
func (c *cli) hintUnreachable(err error) error {
	var ce *callError
	if !errors.As(err, &ce) || ce.code != codes.Unavailable || !strings.HasPrefix(ce.status, "connection error") {
		return err
	}
	return fmt.Errorf("no server answers at %s (give --addr or LLMGW_ADDR): %w", c.addr, err)
}

// hintTLS adds what gRPC's own message does not say: a plain-text call to
// a TLS server fails with "error reading server preface: EOF", which an
// operator cannot read as "give certificates".
func (c *cli) hintTLS(err error) error {
	if err == nil || c.tls.Enabled() || !strings.Contains(err.Error(), "server preface") {
		return err
	}
	return fmt.Errorf("%w (the server may require TLS: give --tls-ca, --tls-cert and --tls-key, or LLMGW_TLS_CA, LLMGW_TLS_CERT and LLMGW_TLS_KEY)", err)
}

// credentials are how llmgwctl dials a server: mutual TLS with --tls-*,
// expecting a server's certificate, or plain text without them.
func (c *cli) credentials() (grpc.DialOption, error) {
	if !c.tls.Enabled() {
		return mtls.DialOption(nil, mtls.RoleServer), nil
	}
	src, err := mtls.Load(c.tls)
	if err != nil {
		return nil, err
	}
	return mtls.DialOption(src, mtls.RoleServer), nil
}

// plainError turns a gRPC status into the server's message, which already
// names the field or object at fault; the code is noise to an operator,
// kept only for the exit status (exitCode). The operation a command
// wrapped around the status ("raft remove-peer c3: ...") is kept.
func plainError(err error) error {
	if err == nil {
		return nil
	}
	var se interface{ GRPCStatus() *status.Status }
	if !errors.As(err, &se) {
		return err
	}
	inner := se.(error).Error()
	st := se.GRPCStatus()
	return &callError{code: st.Code(), msg: strings.Replace(err.Error(), inner, st.Message(), 1), status: st.Message()}
}
