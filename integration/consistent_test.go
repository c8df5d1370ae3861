package integration

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	llmgwv1 "github.com/llmgw/llmgw/proto/llmgw/v1"
)

// llmgwctl's exit statuses (cmd/llmgwctl/exit.go), as a script reads them.
const (
	exitNotFound    = 3
	exitUnavailable = 4
)

// ctlRun is one llmgwctl run against addr: its stdout, stderr, exit status
// and how long it took.
type ctlRun struct {
	stdout, stderr string
	code           int
	took           time.Duration
}

func ctlExit(t *testing.T, addr string, args ...string) ctlRun {
	t.Helper()
	cmd := exec.Command(bins.llmgwctl, append([]string{"--addr", addr}, args...)...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	start := time.Now()
	err := cmd.Run()
	r := ctlRun{stdout: stdout.String(), stderr: stderr.String(), took: time.Since(start)}
	var ee *exec.ExitError
	switch {
	case errors.As(err, &ee):
		r.code = ee.ExitCode()
	case err != nil:
		t.Fatalf("llmgwctl %s: %v", strings.Join(args, " "), err)
	}
	return r
}

// modelFile writes a model file for `llmgwctl model apply -f`.
func modelFile(t *testing.T, name string, replicas int) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), name+".yaml")
	body := fmt.Sprintf("name: %s\nengine: sim\nmodel: llmgw/consistent\nreplicas: %d\ngpus_per_replica: 1\n", name, replicas)
	if err := os.WriteFile(p, []byte(body), 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

// TestConsistentReadsThroughAFollower is issue #13's "a follower answered
// 542 models while the leader had 543": a read asked of a follower with
// consistent (llmgwctl --consistent) is answered by the leader past its
// barrier and VerifyLeader (design §5.3), so right after each of 200
// writes through the leader it holds the write — revision at least the
// write's, the model as written — while the follower's own answer may
// lag. Not-found is a clear message and exit status through a follower.
func TestConsistentReadsThroughAFollower(t *testing.T) {
	c := startCluster(t, 3)
	leader := c.waitLeader(c.servers, formTimeout)
	c.waitPeers(c.servers, ids(c.servers), formTimeout)
	follower := without(c.servers, leader)[0]
	la, closeL := admin(t, leader.grpc)
	defer closeL()
	fa, closeF := admin(t, follower.grpc)
	defer closeF()

	const writes = 200
	plainLagged := 0
	for i := range writes {
		ctx, cancel := context.WithTimeout(context.Background(), within(10*time.Second))
		name, replicas := fmt.Sprintf("c%d", i%10), uint32(1+i%3)
		w, err := la.ApplyModel(ctx, &llmgwv1.ApplyModelRequest{Model: &llmgwv1.Model{
			Name: name, Engine: "sim", Model: "llmgw/consistent", Replicas: replicas, GpusPerReplica: 1}})
		if err != nil {
			cancel()
			t.Fatalf("write %d: %v", i, err)
		}
		got, err := fa.ListModels(ctx, &llmgwv1.ListRequest{Consistent: true})
		if err != nil {
			cancel()
			t.Fatalf("consistent read %d through %s: %v", i, follower.id, err)
		}
		if got.Revision < w.Revision || replicasOf(got.Models, name) != replicas {
			cancel()
			t.Fatalf("write %d (revision %d, %s with %d replicas): the consistent read through %s answered revision %d with %s at %d replicas",
				i, w.Revision, name, replicas, follower.id, got.Revision, name, replicasOf(got.Models, name))
		}
		plain, err := fa.ListModels(ctx, &llmgwv1.ListRequest{})
		cancel()
		if err != nil {
			t.Fatalf("plain read %d through %s: %v", i, follower.id, err)
		}
		if plain.Revision < w.Revision {
			plainLagged++
		}
	}
	t.Logf("%d writes through %s: every consistent read through %s held its write; %d plain reads there lagged it", writes, leader.id, follower.id, plainLagged)
	// The follower's own copy may lag, and must have here, or the check
	// above showed nothing: it learns a commit with the leader's next
	// append (the next write, or raft's 50 ms CommitTimeout).
	if plainLagged == 0 {
		t.Errorf("no plain read through %s lagged its write in %d: the consistent reads were not put to the test", follower.id, writes)
	}

	// The same through llmgwctl, right after a write.
	if r := ctlExit(t, leader.grpc, "model", "apply", "-f", modelFile(t, "cli", 2)); r.code != 0 {
		t.Fatalf("model apply: exit %d: %s", r.code, r.stderr)
	}
	r := ctlExit(t, follower.grpc, "model", "list", "--consistent", "-o", "json")
	var models []struct {
		Name     string `json:"name"`
		Replicas int    `json:"replicas"`
	}
	if r.code != 0 || json.Unmarshal([]byte(r.stdout), &models) != nil {
		t.Fatalf("model list --consistent through %s: exit %d: %s%s", follower.id, r.code, r.stdout, r.stderr)
	}
	found := false
	for _, m := range models {
		found = found || m.Name == "cli" && m.Replicas == 2
	}
	if !found {
		t.Errorf("model list --consistent through %s right after the write lacks cli: %s", follower.id, r.stdout)
	}
	for _, list := range []string{"node", "replica", "apikey"} {
		if r := ctlExit(t, follower.grpc, list, "list", "--consistent"); r.code != 0 {
			t.Errorf("%s list --consistent through %s: exit %d: %s", list, follower.id, r.code, r.stderr)
		}
	}

	// Not found, through a follower (forwarded to the leader).
	for _, tt := range []struct {
		args []string
		want string
	}{
		{[]string{"model", "delete", "nope"}, `llmgwctl: model delete: model "nope" not found`},
		{[]string{"apikey", "revoke", "nope"}, `llmgwctl: apikey revoke nope: api key "nope" not found`},
		{[]string{"node", "drain", "nope"}, `llmgwctl: node drain: node "nope" not found`},
	} {
		r := ctlExit(t, follower.grpc, tt.args...)
		if r.code != exitNotFound || strings.TrimSpace(r.stderr) != tt.want {
			t.Errorf("llmgwctl %s: exit %d, stderr %q; want %d, %q", strings.Join(tt.args, " "), r.code, r.stderr, exitNotFound, tt.want)
		}
	}
}

func replicasOf(models []*llmgwv1.Model, name string) uint32 {
	for _, m := range models {
		if m.Name == name {
			return m.Replicas
		}
	}
	return 0
}

// TestNoLeaderIsClear is issue #13's "with no leader, writes fail with
// RST_STREAM CANCEL": with 2 of 3 servers killed, a write through the
// survivor fails within llmgwctl's --timeout — shorter than the server's
// 5 s rpc_hold_timeout, or longer — with exit status 4 and a message that
// says there is no leader and how many voters the survivor reaches; a
// consistent read fails the same way, while a plain read is still answered
// from the survivor's copy.
func TestNoLeaderIsClear(t *testing.T) {
	c := startCluster(t, 3)
	leader := c.waitLeader(c.servers, formTimeout)
	c.waitPeers(c.servers, ids(c.servers), formTimeout)
	survivor := without(c.servers, leader)[0]
	if r := ctlExit(t, survivor.grpc, "model", "apply", "-f", modelFile(t, "before", 1)); r.code != 0 {
		t.Fatalf("model apply with a leader: exit %d: %s", r.code, r.stderr)
	}
	// The survivor's copy holds the model before the others go, so its
	// plain read below has something to show.
	if !eventually(10*time.Second, func() bool {
		return strings.Contains(ctlExit(t, survivor.grpc, "model", "list", "-o", "json").stdout, `"before"`)
	}) {
		t.Fatalf("%s never listed the model written through it", survivor.id)
	}
	gone := without(c.servers, survivor)
	for _, s := range gone {
		s.kill()
	}
	// Until gossip marks them dead the survivor cannot say which voters
	// are missing (it says an election may be under way).
	if err := eventuallyErr(30*time.Second, func() error {
		v, err := survivor.members()
		if err != nil {
			return err
		}
		for _, m := range v.Members {
			if m.ID != survivor.id && m.Status == "alive" {
				return fmt.Errorf("%s still sees %s alive", survivor.id, m.ID)
			}
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}

	wantMsg := []string{"no leader: " + survivor.id + " found no leader", "it reaches 1 of 3 voters", "a quorum needs 2"}
	file := modelFile(t, "after", 1)
	for _, tt := range []struct {
		name    string
		timeout time.Duration
		args    []string
	}{
		{"write, --timeout shorter than the hold", 3 * time.Second, []string{"model", "apply", "-f", file}},
		{"write, --timeout longer than the hold", within(15 * time.Second).Round(time.Second), []string{"model", "delete", "before"}},
		{"consistent read", 3 * time.Second, []string{"replica", "list", "--consistent"}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			r := ctlExit(t, survivor.grpc, append([]string{"--timeout", tt.timeout.String()}, tt.args...)...)
			t.Logf("llmgwctl %s failed in %v (--timeout %v): exit %d: %s", strings.Join(tt.args, " "), r.took.Round(time.Millisecond), tt.timeout, r.code, strings.TrimSpace(r.stderr))
			if r.code != exitUnavailable {
				t.Errorf("exit status %d, want %d (unavailable)", r.code, exitUnavailable)
			}
			for _, w := range wantMsg {
				if !strings.Contains(r.stderr, w) {
					t.Errorf("stderr lacks %q", w)
				}
			}
			if slack := within(3 * time.Second); r.took > tt.timeout+slack {
				t.Errorf("took %v, beyond --timeout %v and %v for the process", r.took, tt.timeout, slack)
			}
		})
	}
	r := ctlExit(t, survivor.grpc, "model", "list", "-o", "json")
	if r.code != 0 || !strings.Contains(r.stdout, `"before"`) {
		t.Errorf("plain model list on the survivor: exit %d: %s%s", r.code, r.stdout, r.stderr)
	}
}
