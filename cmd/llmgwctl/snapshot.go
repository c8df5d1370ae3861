package main

import (
	"context"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"strconv"

	"github.com/spf13/cobra"

	"github.com/llmgw/llmgw/controlplane/snapfile"
	"github.com/llmgw/llmgw/fsm"
	"github.com/llmgw/llmgw/internal/atomicfile"
	llmgwv1 "github.com/llmgw/llmgw/proto/llmgw/v1"
)

// snapshotCmd is backup and restore of the desired state (design §13.4). The
// file is the server's, checksummed (controlplane/snapfile); llmgwctl checks
// it before writing it to disk and before sending it, so an operator hears
// of a bad file from the tool in their hand.
func (c *cli) snapshotCmd() *cobra.Command {
	cmd := &cobra.Command{Use: "snapshot", Short: "Back up and restore the desired state: save, restore, inspect"}
	cmd.AddCommand(c.snapshotSaveCmd(), c.snapshotRestoreCmd(), c.snapshotInspectCmd())
	return cmd
}

func (c *cli) snapshotSaveCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "save FILE",
		Short: "Save the leader's desired state to FILE (written whole or not at all)",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			path := args[0]
			var file []byte
			err := c.admin(cmd.Context(), func(ctx context.Context, a llmgwv1.AdminServiceClient) error {
				st, err := a.SnapshotSave(ctx, &llmgwv1.SnapshotSaveRequest{})
				if err != nil {
					return fmt.Errorf("snapshot save: %w", err)
				}
				for {
					ch, err := st.Recv()
					if errors.Is(err, io.EOF) {
						return nil
					}
					if err != nil {
						return fmt.Errorf("snapshot save: %w", err)
					}
					if len(file)+len(ch.Data) > snapfile.HeaderSize+snapfile.MaxBody {
						return fmt.Errorf("snapshot save: the server sent more than %d bytes", snapfile.HeaderSize+snapfile.MaxBody)
					}
					file = append(file, ch.Data...)
				}
			})
			if err != nil {
				return err
			}
			h, _, err := snapfile.Decode(file)
			if err != nil {
				return fmt.Errorf("snapshot save: the server's file: %w", err)
			}
			// Atomically, so a failed save never leaves a partial file
			// under the name a later restore would read; 0600, for the
			// state holds the API keys' hashes.
			if err := atomicfile.Write(path, file, 0o600); err != nil {
				return fmt.Errorf("snapshot save: %w", err)
			}
			if c.output == "json" {
				return c.printJSON(snapshotSummary{File: path, Revision: h.Revision, Bytes: len(file), SHA256: hex.EncodeToString(h.SHA256[:])})
			}
			_, err = fmt.Fprintf(c.out, "saved revision %d to %s (%d bytes, sha256 %x)\n", h.Revision, path, len(file), h.SHA256)
			return err
		},
	}
}

func (c *cli) snapshotRestoreCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "restore FILE",
		Short: "Replace the cluster's desired state with FILE's (models, replicas, config; live nodes are kept)",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			file, h, _, err := readSnapshotFile(args[0])
			if err != nil {
				return fmt.Errorf("snapshot restore: %w", err)
			}
			var resp *llmgwv1.SnapshotRestoreResponse
			err = c.admin(cmd.Context(), func(ctx context.Context, a llmgwv1.AdminServiceClient) error {
				st, err := a.SnapshotRestore(ctx)
				if err != nil {
					return fmt.Errorf("snapshot restore: %w", err)
				}
				for rest := file; len(rest) > 0; {
					n := min(len(rest), 256<<10)
					if err := st.Send(&llmgwv1.SnapshotChunk{Data: rest[:n]}); err != nil {
						break // CloseAndRecv returns the reason
					}
					rest = rest[n:]
				}
				if resp, err = st.CloseAndRecv(); err != nil {
					return fmt.Errorf("snapshot restore: %w", err)
				}
				return nil
			})
			if err != nil {
				return err
			}
			if c.output == "json" {
				return c.printJSON(map[string]any{"file": args[0], "snapshot_revision": h.Revision, "revision": resp.Revision})
			}
			_, err = fmt.Fprintf(c.out, "restored %s (saved at revision %d); the cluster is at revision %d\n", args[0], h.Revision, resp.Revision)
			return err
		},
	}
}

// snapshotSummary is what inspect (and save's -o json) report of a file.
type snapshotSummary struct {
	File        string   `json:"file"`
	FileVersion uint16   `json:"file_version,omitempty"`
	StateFormat uint32   `json:"state_format,omitempty"`
	Revision    uint64   `json:"revision"`
	Bytes       int      `json:"bytes"`
	SHA256      string   `json:"sha256"`
	Models      []string `json:"models,omitempty"`
	Nodes       int      `json:"nodes"`
	Replicas    int      `json:"replicas"`
}

func (c *cli) snapshotInspectCmd() *cobra.Command {
	return &cobra.Command{
		Use:   "inspect FILE",
		Short: "Check FILE (checksum, format) and summarise it, without a server",
		Args:  cobra.ExactArgs(1),
		RunE: func(_ *cobra.Command, args []string) error {
			file, h, st, err := readSnapshotFile(args[0])
			if err != nil {
				return fmt.Errorf("snapshot inspect: %w", err)
			}
			s := snapshotSummary{File: args[0], FileVersion: h.Version, StateFormat: st.Format, Revision: h.Revision,
				Bytes: len(file), SHA256: hex.EncodeToString(h.SHA256[:]), Nodes: len(st.Nodes), Replicas: len(st.Replicas)}
			for _, m := range st.Models {
				s.Models = append(s.Models, m.Name)
			}
			if c.output == "json" {
				return c.printJSON(s)
			}
			rows := [][]string{
				{"file", s.File}, {"file format", strconv.Itoa(int(s.FileVersion))}, {"state format", strconv.Itoa(int(s.StateFormat))},
				{"revision", strconv.FormatUint(s.Revision, 10)}, {"bytes", strconv.Itoa(s.Bytes)}, {"sha256", s.SHA256},
				{"models", strconv.Itoa(len(s.Models))}, {"nodes", strconv.Itoa(s.Nodes)}, {"replicas", strconv.Itoa(s.Replicas)},
			}
			for _, m := range s.Models {
				rows = append(rows, []string{"model", m})
			}
			return c.printTable([]string{"FIELD", "VALUE"}, rows)
		},
	}
}

// readSnapshotFile reads and checks a snapshot file the way a server would:
// the header and checksum, then the state restored into a scratch FSM.
func readSnapshotFile(path string) ([]byte, snapfile.Header, *llmgwv1.State, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, snapfile.Header{}, nil, err
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, snapfile.HeaderSize+snapfile.MaxBody+1))
	if err != nil {
		return nil, snapfile.Header{}, nil, fmt.Errorf("read %s: %w", path, err)
	}
	h, body, err := snapfile.Decode(b)
	if err != nil {
		return nil, h, nil, fmt.Errorf("%s: %w", path, err)
	}
	scratch := fsm.New(fsm.Config{})
	if err := scratch.Restore(body); err != nil {
		return nil, h, nil, fmt.Errorf("%s: %w", path, err)
	}
	return b, h, scratch.State(), nil
}
