// Package server is the ServerService (design §5.3): the RPCs control
// servers make of each other, never agents, routers or llmgwctl.
//
// RegisterNode is how a server holding an agent's session has the leader
// commit the agent's registration (a new node, a changed one, one back from
// DOWN). Before it, a follower replayed the agent's hello to the leader on
// a forwarded AgentService.Attach; the leader still answers that for one
// release, for followers older than this service (package agent), and a
// follower whose leader answers UNIMPLEMENTED falls back to it.
//
// Only the leader answers: a follower refuses with UNAVAILABLE naming the
// leader and does not forward, since the caller has already found the
// leader and holds and retries on its own.
package server
