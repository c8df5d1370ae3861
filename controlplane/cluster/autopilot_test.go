package cluster

import (
	"testing"
	"time"

	"google.golang.org/grpc/metadata"
	"google.golang.org/protobuf/proto"

	llmgwv1 "github.com/llmgw/llmgw/proto/llmgw/v1"
)

// TestReportedStats: the raft_last_* fields when a server sends them all,
// else the headers of a server older than them, else nothing.
func TestReportedStats(t *testing.T) {
	hdr := metadata.Pairs(HeaderLastIndex, "7", HeaderLastTerm, "2", HeaderLastContact, "30")
	fields := &llmgwv1.ClusterStatusResponse{RaftLastIndex: proto.Uint64(42), RaftLastTerm: proto.Uint64(3), RaftLastContactMs: proto.Int64(5)}
	tests := []struct {
		name                 string
		cs                   *llmgwv1.ClusterStatusResponse
		hdr                  metadata.MD
		ok                   bool
		index, term, contact uint64
	}{
		{"fields", fields, nil, true, 42, 3, 5},
		{"fields win over headers", fields, hdr, true, 42, 3, 5},
		{"old server: headers", &llmgwv1.ClusterStatusResponse{}, hdr, true, 7, 2, 30},
		{"fields in part: headers", &llmgwv1.ClusterStatusResponse{RaftLastIndex: proto.Uint64(42)}, hdr, true, 7, 2, 30},
		{"leader: zero contact", &llmgwv1.ClusterStatusResponse{RaftLastIndex: proto.Uint64(9), RaftLastTerm: proto.Uint64(1), RaftLastContactMs: proto.Int64(0)}, nil, true, 9, 1, 0},
		{"neither", &llmgwv1.ClusterStatusResponse{}, nil, false, 0, 0, 0},
		{"a header missing", &llmgwv1.ClusterStatusResponse{}, metadata.Pairs(HeaderLastIndex, "7", HeaderLastTerm, "2"), false, 0, 0, 0},
		{"a header not a number", &llmgwv1.ClusterStatusResponse{}, metadata.Pairs(HeaderLastIndex, "x", HeaderLastTerm, "2", HeaderLastContact, "30"), false, 0, 0, 0},
		{"negative contact", &llmgwv1.ClusterStatusResponse{RaftLastIndex: proto.Uint64(9), RaftLastTerm: proto.Uint64(1), RaftLastContactMs: proto.Int64(-1)}, nil, false, 0, 0, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			st, ok := reportedStats(tt.cs, tt.hdr)
			if ok != tt.ok {
				t.Fatalf("ok %v, want %v (%+v)", ok, tt.ok, st)
			}
			if ok && (st.LastIndex != tt.index || st.LastTerm != tt.term || st.LastContact != time.Duration(tt.contact)*time.Millisecond) {
				t.Fatalf("stats %+v, want index %d term %d contact %d ms", st, tt.index, tt.term, tt.contact)
			}
		})
	}
}
