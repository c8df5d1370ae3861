package controlplane

import (
	"context"
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/llmgw/llmgw/controlplane/snapfile"
	"github.com/llmgw/llmgw/internal/testkit"
	llmgwv1 "github.com/llmgw/llmgw/proto/llmgw/v1"
)

func saveSnapshot(ctx context.Context, a llmgwv1.AdminServiceClient) ([]byte, error) {
	st, err := a.SnapshotSave(ctx, &llmgwv1.SnapshotSaveRequest{})
	if err != nil {
		return nil, err
	}
	var out []byte
	for {
		c, err := st.Recv()
		if errors.Is(err, io.EOF) {
			return out, nil
		}
		if err != nil {
			return nil, err
		}
		out = append(out, c.Data...)
	}
}

// restoreSnapshot sends file in small chunks, so reassembly is exercised.
func restoreSnapshot(ctx context.Context, a llmgwv1.AdminServiceClient, file []byte) (*llmgwv1.SnapshotRestoreResponse, error) {
	st, err := a.SnapshotRestore(ctx)
	if err != nil {
		return nil, err
	}
	for len(file) > 0 {
		n := min(len(file), 100)
		if err := st.Send(&llmgwv1.SnapshotChunk{Data: file[:n]}); err != nil {
			break
		}
		file = file[n:]
	}
	return st.CloseAndRecv()
}

func modelNames(ctx context.Context, a llmgwv1.AdminServiceClient) ([]string, uint64, error) {
	resp, err := a.ListModels(ctx, &llmgwv1.ListRequest{})
	if err != nil {
		return nil, 0, err
	}
	var names []string
	for _, m := range resp.Models {
		names = append(names, m.Name)
	}
	return names, resp.Revision, nil
}

func applyModels(ctx context.Context, t *testing.T, a llmgwv1.AdminServiceClient, names ...string) {
	t.Helper()
	for _, n := range names {
		if _, err := a.ApplyModel(ctx, &llmgwv1.ApplyModelRequest{Model: &llmgwv1.Model{Name: n, Engine: "sim", Model: "m", Replicas: 1}}); err != nil {
			t.Fatalf("apply %s: %v", n, err)
		}
	}
}

// TestSnapshotSaveRestore: a snapshot of one cluster restored into another
// replaces its models, at a revision above everything it had applied; bad
// files are refused, naming what is wrong, with the state unchanged.
func TestSnapshotSaveRestore(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 45*time.Second)
	defer cancel()
	src := start(t, testConfig(t, t.TempDir(), freeAddr(t)))
	defer src.stop(t)
	dst := start(t, testConfig(t, t.TempDir(), freeAddr(t)))
	defer dst.stop(t)
	srcAdmin, dstAdmin := llmgwv1.NewAdminServiceClient(src.conn), llmgwv1.NewAdminServiceClient(dst.conn)

	applyModels(ctx, t, srcAdmin, "alpha", "beta")
	applyModels(ctx, t, dstAdmin, "gamma")
	file, err := saveSnapshot(ctx, srcAdmin)
	if err != nil {
		t.Fatalf("save: %v", err)
	}
	h, _, err := snapfile.Decode(file)
	if err != nil {
		t.Fatalf("the saved file does not decode: %v", err)
	}
	_, srcRev, _ := modelNames(ctx, srcAdmin)
	if h.Revision != srcRev {
		t.Fatalf("file revision %d, source at %d", h.Revision, srcRev)
	}

	before, beforeRev, err := modelNames(ctx, dstAdmin)
	if err != nil {
		t.Fatal(err)
	}
	corrupt := slices.Clone(file)
	corrupt[len(corrupt)-1] ^= 0xff
	for _, tc := range []struct {
		name, want string
		file       []byte
	}{
		{"flipped byte", "checksum", corrupt},
		{"truncated", "truncated", file[:len(file)-3]},
		{"not a snapshot", "not an llmgw snapshot", []byte(strings.Repeat("x", 100))},
		{"empty", "shorter than", nil},
		{"valid file, body not a state", "restore", snapfile.Encode(1, []byte{0xff, 0xff, 0xff})},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := restoreSnapshot(ctx, dstAdmin, tc.file)
			if status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), "snapshot:") || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("restore: got %v, want InvalidArgument naming the snapshot and %q", err, tc.want)
			}
			after, afterRev, err := modelNames(ctx, dstAdmin)
			if err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(after, before) || afterRev != beforeRev {
				t.Fatalf("a refused restore changed the state: %v@%d, was %v@%d", after, afterRev, before, beforeRev)
			}
		})
	}

	resp, err := restoreSnapshot(ctx, dstAdmin, file)
	if err != nil {
		t.Fatalf("restore: %v", err)
	}
	got, gotRev, err := modelNames(ctx, dstAdmin)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(got, []string{"alpha", "beta"}) {
		t.Fatalf("models after restore: %v", got)
	}
	if gotRev <= beforeRev || resp.Revision != gotRev {
		t.Fatalf("revision after restore %d (response %d), before %d: must move forward", gotRev, resp.Revision, beforeRev)
	}
	// The restored cluster keeps working: writes apply above the restore.
	applyModels(ctx, t, dstAdmin, "delta")
	if _, rev, _ := modelNames(ctx, dstAdmin); rev <= gotRev {
		t.Fatalf("write after restore at revision %d, restore at %d", rev, gotRev)
	}
}

// TestSnapshotRestoreHA: a restore sent to a follower is forwarded to the
// leader, and every server ends with the restored state (the followers
// through Raft's snapshot install); a save through a follower is the
// leader's state.
func TestSnapshotRestoreHA(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Second)
	defer cancel()
	src := start(t, testConfig(t, t.TempDir(), freeAddr(t)))
	defer src.stop(t)
	applyModels(ctx, t, llmgwv1.NewAdminServiceClient(src.conn), "alpha", "beta")
	file, err := saveSnapshot(ctx, llmgwv1.NewAdminServiceClient(src.conn))
	if err != nil {
		t.Fatal(err)
	}

	c := newHACluster(t, 3, "s1", "s2", "s3")
	leader := c.agreedLeader(ctx, 3)
	follower := c.follower(leader)
	applyModels(ctx, t, c.admin(leader), "gamma")
	testkit.WaitCtx(ctx, t, "restore through a follower", func() error {
		_, err := restoreSnapshot(ctx, c.admin(follower), file)
		return err
	})
	for id := range c.nodes {
		testkit.WaitCtx(ctx, t, id+" holds the restored models", func() error {
			got, _, err := modelNames(ctx, c.admin(id))
			if err != nil {
				return err
			}
			if !slices.Equal(got, []string{"alpha", "beta"}) {
				return fmt.Errorf("models %v", got)
			}
			return nil
		})
	}
	saved, err := saveSnapshot(ctx, c.admin(follower))
	if err != nil {
		t.Fatalf("save through a follower: %v", err)
	}
	if _, _, err := snapfile.Decode(saved); err != nil {
		t.Fatalf("the file saved through a follower: %v", err)
	}
}
