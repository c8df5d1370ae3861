// Package watch is the WatchService (design §5.3): the routers' merged
// watch stream — desired state, the server list, every agent's ephemeral
// data (replica status, KV, adapters), and heartbeats.
//
// Design:
//   - Desired state: the server first waits (up to WatchWait) until it has
//     applied from_revision, else it answers UNAVAILABLE and the client
//     tries another server; then it sends the changes after it and a mark,
//     or — from 0, or when the change log no longer reaches back — a
//     snapshot framed by begin/end markers. A client never moves
//     backwards.
//   - Ephemeral data: a full copy per node after every (re)connect, then
//     the deltas exactly as the agents sent them, with their (node, epoch,
//     seq). The desired state is sent before a delta that follows it, so a
//     router never gets a status for a uid it cannot know yet.
//   - A slow watcher never blocks the others: desired state is read from
//     the FSM's change log at the watcher's own pace, and ephemeral updates
//     wait in a bounded per-watcher queue; a watcher that fills it is
//     disconnected (UNAVAILABLE) and resumes from its revision.
package watch
