package integration

import (
	"encoding/json"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"
)

// devPorts are the addresses `llmgw dev` would otherwise take by default,
// made free, so two devs (or a dev and another test's processes) can run at
// once.
func devPorts(t *testing.T, portRange string) []string {
	return []string{"--raft-addr", freeAddr(t), "--control-http-addr", freeAddr(t),
		"--agent-http-addr", freeAddr(t), "--agent-grpc-addr", freeAddr(t), "--port-range", portRange}
}

// desiredState is what an operator compares across clusters: the models as
// `model list -o json` prints them, and each replica's placement without
// its status (which is the engines', not the desired state).
func desiredState(t *testing.T, d *devProcess) (models any, replicas []json.RawMessage) {
	t.Helper()
	out, err := d.ctl("model", "list", "-o", "json")
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal([]byte(out), &models); err != nil {
		t.Fatalf("decode model list: %v: %s", err, out)
	}
	out, err = d.ctl("replica", "list", "-o", "json")
	if err != nil {
		t.Fatal(err)
	}
	var list []struct {
		Replica json.RawMessage `json:"replica"`
	}
	if err := json.Unmarshal([]byte(out), &list); err != nil {
		t.Fatalf("decode replica list: %v: %s", err, out)
	}
	for _, r := range list {
		replicas = append(replicas, r.Replica)
	}
	return models, replicas
}

// TestSnapshotSaveRestore (design §13.4): a snapshot saved on one cluster and
// restored into a fresh one gives the same desired state; a corrupted file
// is refused with a clear error and changes nothing.
func TestSnapshotSaveRestore(t *testing.T) {
	src := startDev(t, devPorts(t, "21000-21099")...)
	file := filepath.Join(t.TempDir(), "second.yaml")
	writeFile(t, file, "name: second\nengine: sim\nmodel: m\nreplicas: 1\n")
	if out, err := src.ctl("model", "apply", "-f", file); err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	if !eventually(30*time.Second, func() bool {
		rs := src.modelReplicas("second")
		return len(rs) == 1 && rs[0].Replica.Node != ""
	}) {
		t.Fatalf("the second model was not placed within %v", within(30*time.Second))
	}
	snap := filepath.Join(t.TempDir(), "backup.snap")
	if out, err := src.ctl("snapshot", "save", snap); err != nil || !strings.Contains(out, "saved revision") {
		t.Fatalf("snapshot save: %v: %s", err, out)
	}
	if out, err := src.ctl("snapshot", "inspect", snap); err != nil || !strings.Contains(out, "second") {
		t.Fatalf("snapshot inspect: %v: %s", err, out)
	}
	wantModels, wantReplicas := desiredState(t, src)

	dst := startDev(t, devPorts(t, "21100-21199")...)
	beforeModels, beforeReplicas := desiredState(t, dst)

	b, err := os.ReadFile(snap)
	if err != nil {
		t.Fatal(err)
	}
	b[len(b)-5] ^= 0x40
	bad := filepath.Join(t.TempDir(), "corrupt.snap")
	if err := os.WriteFile(bad, b, 0o644); err != nil {
		t.Fatal(err)
	}
	out, err := dst.ctl("snapshot", "restore", bad)
	if err == nil || !strings.Contains(err.Error(), "corrupt") || !strings.Contains(err.Error(), "checksum") {
		t.Fatalf("restoring a corrupted file: %v: %s", err, out)
	}
	if models, replicas := desiredState(t, dst); !reflect.DeepEqual(models, beforeModels) || !reflect.DeepEqual(replicas, beforeReplicas) {
		t.Fatalf("a refused restore changed the state:\nmodels %v\nwere   %v", models, beforeModels)
	}

	if out, err := dst.ctl("snapshot", "restore", snap); err != nil {
		t.Fatalf("snapshot restore: %v: %s", err, out)
	}
	models, replicas := desiredState(t, dst)
	if !reflect.DeepEqual(models, wantModels) {
		t.Fatalf("models after restore:\n%v\nwant\n%v", models, wantModels)
	}
	if !reflect.DeepEqual(jsonStrings(replicas), jsonStrings(wantReplicas)) {
		t.Fatalf("replicas after restore:\n%s\nwant\n%s", jsonStrings(replicas), jsonStrings(wantReplicas))
	}
	// The restored cluster serves from the restored state.
	dst.waitReady("second", 1, 60*time.Second)
}

func jsonStrings(list []json.RawMessage) []string {
	out := make([]string, len(list))
	for i, r := range list {
		out[i] = string(r)
	}
	return out
}
