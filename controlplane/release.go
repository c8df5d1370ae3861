package controlplane

import (
	"context"

	"google.golang.org/grpc"

	llmgwv1 "github.com/llmgw/llmgw/proto/llmgw/v1"
)

// Two releases in one tree. The upgrade test runs this tree as this
// release, and built with the tag llmgw_upgrade_old as the previous one
// (fsm's gate_old.go then leaves the gated commands out). In that build
// asPreviousRelease (release_new.go, release_old.go) makes the node serve
// and send only what the previous release did, so the test meets the old
// wire contract rather than this tree's under an old version number:
//
//   - no ServerService: a newer follower gets UNIMPLEMENTED from it as
//     leader and forwards registrations as a hello, and it forwards them
//     only that way itself;
//   - ClusterStatus without the raft_last_* fields, only the headers, which
//     newer readers fall back to;
//   - removals of servers kept in gossip only.

// previousReleaseStatus strips from ClusterStatus what the previous
// release did not send.
func previousReleaseStatus(ctx context.Context, req any, _ *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
	resp, err := handler(ctx, req)
	if cs, ok := resp.(*llmgwv1.ClusterStatusResponse); ok {
		cs.RaftLastIndex, cs.RaftLastTerm, cs.RaftLastContactMs = nil, nil, nil
	}
	return resp, err
}
