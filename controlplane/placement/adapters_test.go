package placement

import (
	"errors"
	"testing"
	"time"
)

func TestChooseAdapterReplica(t *testing.T) {
	now := time.Unix(10000, 0)
	ago := func(s int) time.Time { return now.Add(-time.Duration(s) * time.Second) }
	idle := func(s int) AdapterUse { return AdapterUse{Reported: true, Loaded: true, LastUsed: ago(s)} }
	failed := func(s int) AdapterUse { return AdapterUse{Reported: true, Failed: true, LastUsed: ago(s)} }
	busy := AdapterUse{Reported: true, Loaded: true, Active: 2, LastUsed: ago(100)}
	uses := map[string]AdapterUse{
		"r0/a": idle(50), "r0/b": busy,
		"r1/c": idle(300), "r1/d": idle(20),
		"r2/e": {Reported: true, Loading: true, LastUsed: ago(500)},
		"r2/f": {Reported: false},
		"r3/g": idle(1), // used within MinIdle
		"r3/h": busy,
		// Placed, never loaded: its load failed long ago, or just now.
		"r4/i": failed(900), "r4/j": busy,
		"r5/k": failed(1), "r5/l": busy,
		// Reported in passing (being unloaded): idle, but not evictable.
		"r6/m": {Reported: true, LastUsed: ago(900)}, "r6/n": busy,
	}
	use := func(r, a string) AdapterUse { return uses[r+"/"+a] }
	tests := []struct {
		name     string
		adapter  string
		replicas []AdapterReplica
		want     AdapterChoice
		wantErr  error
	}{
		{name: "a replica that holds it, even not ready", adapter: "a", replicas: []AdapterReplica{
			{ID: "r1", Ready: true, Placed: []string{"c"}}, {ID: "r0", Placed: []string{"a", "b"}}},
			want: AdapterChoice{Replica: "r0", Holds: true}},
		{name: "a free slot, the emptiest", adapter: "x", replicas: []AdapterReplica{
			{ID: "r0", Ready: true, Placed: []string{"a"}}, {ID: "r1", Ready: true}, {ID: "r2", Ready: true}},
			want: AdapterChoice{Replica: "r1"}},
		{name: "a free slot on a replica not ready is not used", adapter: "x", replicas: []AdapterReplica{
			{ID: "r0", Ready: true, Placed: []string{"a", "b"}}, {ID: "r5"}},
			want: AdapterChoice{Replica: "r0", Evict: "a"}},
		{name: "the least recently used idle adapter is evicted", adapter: "x", replicas: []AdapterReplica{
			{ID: "r0", Ready: true, Placed: []string{"a", "b"}}, {ID: "r1", Ready: true, Placed: []string{"d", "c"}}},
			want: AdapterChoice{Replica: "r1", Evict: "c"}},
		{name: "busy, loading and unreported adapters are never evicted", adapter: "x", replicas: []AdapterReplica{
			{ID: "r0", Ready: true, Placed: []string{"b", "a"}}, {ID: "r2", Ready: true, Placed: []string{"e", "f"}}},
			want: AdapterChoice{Replica: "r0", Evict: "a"}},
		{name: "all busy", adapter: "x", replicas: []AdapterReplica{
			{ID: "r2", Ready: true, Placed: []string{"e", "f"}}, {ID: "r3", Ready: true, Placed: []string{"g", "h"}}},
			wantErr: ErrAllBusy},
		{name: "an idle adapter on a replica not ready is not evicted", adapter: "x", replicas: []AdapterReplica{
			{ID: "r1", Placed: []string{"c", "d"}}, {ID: "r3", Ready: true, Placed: []string{"g", "h"}}},
			wantErr: ErrAllBusy},
		{name: "a LOADED idle adapter goes before an older FAILED placement", adapter: "x", replicas: []AdapterReplica{
			{ID: "r0", Ready: true, Placed: []string{"a", "b"}}, {ID: "r4", Ready: true, Placed: []string{"i", "j"}}},
			want: AdapterChoice{Replica: "r0", Evict: "a"}},
		{name: "a FAILED placement is reused when nothing loaded is idle", adapter: "x", replicas: []AdapterReplica{
			{ID: "r3", Ready: true, Placed: []string{"g", "h"}}, {ID: "r4", Ready: true, Placed: []string{"j", "i"}}},
			want: AdapterChoice{Replica: "r4", Evict: "i"}},
		{name: "a FAILED placement within MinIdle is kept", adapter: "x", replicas: []AdapterReplica{
			{ID: "r5", Ready: true, Placed: []string{"k", "l"}}},
			wantErr: ErrAllBusy},
		{name: "an adapter neither LOADED nor FAILED is never evicted", adapter: "x", replicas: []AdapterReplica{
			{ID: "r6", Ready: true, Placed: []string{"m", "n"}}},
			wantErr: ErrAllBusy},
		{name: "no ready replica", adapter: "x", replicas: []AdapterReplica{{ID: "r0", Placed: []string{"a"}}}, wantErr: ErrNoReplica},
		{name: "no replica at all", adapter: "x", wantErr: ErrNoReplica},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			in := AdapterInputs{Adapter: tt.adapter, Max: 2, Replicas: tt.replicas, Use: use, Now: now, MinIdle: 5 * time.Second}
			got, err := ChooseAdapterReplica(in)
			if !errors.Is(err, tt.wantErr) {
				t.Fatalf("err %v, want %v", err, tt.wantErr)
			}
			if got != tt.want {
				t.Fatalf("got %+v, want %+v", got, tt.want)
			}
			// Never more than Max per replica: a choice that adds to a
			// replica either holds it already, evicts one, or had room.
			for _, r := range tt.replicas {
				if got.Replica == r.ID && !got.Holds && got.Evict == "" && len(r.Placed) >= in.Max {
					t.Fatalf("placed on %s which already holds %d", r.ID, len(r.Placed))
				}
			}
		})
	}
}
