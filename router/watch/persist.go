package watch

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"maps"
	"os"
	"slices"

	"google.golang.org/protobuf/encoding/protodelim"

	"github.com/llmgw/llmgw/internal/atomicfile"
	llmgwv1 "github.com/llmgw/llmgw/proto/llmgw/v1"
)

// The saved state is written in the stream's own words: a framed snapshot
// (snapshot_begin, a PUT per object, snapshot_end), the server list, and a
// full ephemeral copy per node, as size-delimited WatchEvents. So the file
// needs no format of its own and is read by the same rules as the stream.

// maxSavedEvent bounds one event read from the file.
const maxSavedEvent = 64 << 20

func saveState(path string, st *State) error {
	var events []*llmgwv1.WatchEvent
	events = append(events, &llmgwv1.WatchEvent{Event: &llmgwv1.WatchEvent_SnapshotBegin{
		SnapshotBegin: &llmgwv1.SnapshotBegin{Revision: st.Revision}}})
	change := func(ch *llmgwv1.Change) {
		ch.Op = llmgwv1.ChangeOp_CHANGE_OP_PUT
		ch.Revision = st.Revision
		events = append(events, &llmgwv1.WatchEvent{Event: &llmgwv1.WatchEvent_Change{Change: ch}})
	}
	for _, k := range slices.Sorted(maps.Keys(st.Models)) {
		change(&llmgwv1.Change{Object: &llmgwv1.Change_Model{Model: st.Models[k]}})
	}
	for _, k := range slices.Sorted(maps.Keys(st.Nodes)) {
		change(&llmgwv1.Change{Object: &llmgwv1.Change_Node{Node: st.Nodes[k]}})
	}
	for _, k := range slices.Sorted(maps.Keys(st.Replicas)) {
		change(&llmgwv1.Change{Object: &llmgwv1.Change_Replica{Replica: st.Replicas[k]}})
	}
	for _, k := range slices.Sorted(maps.Keys(st.Placements)) {
		change(&llmgwv1.Change{Object: &llmgwv1.Change_AdapterPlacement{AdapterPlacement: st.Placements[k]}})
	}
	// The keys' hashes are kept too, so a router restarted while the
	// control plane is down still checks keys; it honours a revocation made
	// meanwhile once its stream resumes. The file is the owner's alone.
	for _, k := range st.APIKeys.Keys() {
		change(&llmgwv1.Change{Object: &llmgwv1.Change_ApiKey{ApiKey: k}})
	}
	// Tenants too, so limits hold from the first request after a restart.
	for _, k := range slices.Sorted(maps.Keys(st.Tenants)) {
		change(&llmgwv1.Change{Object: &llmgwv1.Change_Tenant{Tenant: st.Tenants[k]}})
	}
	// Aliases too, so a restarted router resolves them from its first
	// request (design §7.9).
	for _, k := range slices.Sorted(maps.Keys(st.Aliases)) {
		change(&llmgwv1.Change{Object: &llmgwv1.Change_Alias{Alias: st.Aliases[k]}})
	}
	if st.Config != nil {
		change(&llmgwv1.Change{Object: &llmgwv1.Change_Config{Config: st.Config}})
	}
	events = append(events,
		&llmgwv1.WatchEvent{Event: &llmgwv1.WatchEvent_SnapshotEnd{SnapshotEnd: &llmgwv1.SnapshotEnd{Revision: st.Revision}}},
		&llmgwv1.WatchEvent{Event: &llmgwv1.WatchEvent_Servers{Servers: &llmgwv1.ServerList{Servers: st.Servers}}})
	for _, node := range slices.Sorted(maps.Keys(st.Ephemeral)) {
		ne := st.Ephemeral[node]
		u := &llmgwv1.EphemeralUpdate{Node: node, Epoch: ne.Epoch, Seq: ne.Seq, Full: true}
		for _, id := range slices.Sorted(maps.Keys(ne.Statuses)) {
			u.Statuses = append(u.Statuses, ne.Statuses[id])
		}
		for _, id := range slices.Sorted(maps.Keys(ne.Adapters)) {
			for _, name := range slices.Sorted(maps.Keys(ne.Adapters[id])) {
				u.Adapters = append(u.Adapters, ne.Adapters[id][name])
			}
		}
		events = append(events, &llmgwv1.WatchEvent{Event: &llmgwv1.WatchEvent_Ephemeral{Ephemeral: u}})
	}
	// Streamed through internal/atomicfile, so a crash leaves the old file
	// or the new one. An error names its cause: proto's for an event that
	// does not encode, the temporary file's for a write.
	err := atomicfile.WriteFunc(path, 0o600, func(w io.Writer) error {
		bw := bufio.NewWriter(w)
		for _, ev := range events {
			if _, err := protodelim.MarshalTo(bw, ev); err != nil {
				return err
			}
		}
		return bw.Flush()
	})
	if err != nil {
		return fmt.Errorf("save state: %w", err)
	}
	return nil
}

// loadState reads a file written by saveState; (nil, nil) when there is none.
func loadState(path string) (*State, error) {
	f, err := os.Open(path)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("load state: %w", err)
	}
	defer f.Close()
	return decodeState(bufio.NewReader(f))
}

// decodeState rebuilds a State from saved events. It accepts only a
// complete snapshot: a file cut short is refused, not half applied.
func decodeState(r *bufio.Reader) (*State, error) {
	opts := protodelim.UnmarshalOptions{MaxSize: maxSavedEvent}
	st := emptyState()
	var begun, ended bool
	for {
		ev := &llmgwv1.WatchEvent{}
		err := opts.UnmarshalFrom(r, ev)
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return nil, fmt.Errorf("load state: decode: %w", err)
		}
		switch e := ev.GetEvent().(type) {
		case *llmgwv1.WatchEvent_SnapshotBegin:
			if begun {
				return nil, errors.New("load state: second snapshot_begin")
			}
			begun = true
			st.Revision = e.SnapshotBegin.GetRevision()
		case *llmgwv1.WatchEvent_Change:
			if !begun || ended {
				return nil, errors.New("load state: change outside the snapshot")
			}
			st.applyChange(e.Change)
		case *llmgwv1.WatchEvent_SnapshotEnd:
			if !begun || e.SnapshotEnd.GetRevision() != st.Revision {
				return nil, errors.New("load state: snapshot_end does not match snapshot_begin")
			}
			ended = true
		case *llmgwv1.WatchEvent_Servers:
			st.Servers = e.Servers.GetServers()
		case *llmgwv1.WatchEvent_Ephemeral:
			if !e.Ephemeral.GetFull() {
				return nil, errors.New("load state: saved ephemeral data must be full copies")
			}
			st.applyEphemeral(e.Ephemeral)
		default:
			return nil, fmt.Errorf("load state: unexpected event %T", e)
		}
	}
	if !ended {
		return nil, errors.New("load state: snapshot not complete")
	}
	st.Synced = true
	return st, nil
}
