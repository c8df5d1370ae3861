// Package gate is the minimum-version gate (design §4, §13.3): a command
// type introduced in a release is proposed only when every server of the
// Raft configuration — voters and non-voters — reports that release or
// newer over gossip; otherwise the proposal is refused with
// FAILED_PRECONDITION naming the servers below it.
//
// The first time the gate opens for a release, the leader commits that
// release as ClusterConfig.min_version before the gated entry, so the log
// itself says which servers may read it: from then on an older server is
// refused at join (package cluster), and one already in the configuration
// stops at the min_version entry (package store) rather than meet a command
// it would have to guess at.
//
// The gate is committed lazily, at the first gated write, not as soon as
// every server runs the new release: until a new command is used, the
// cluster can still be rolled back to the old binaries. Versions compare
// as fsm.CompareVersions: "dev" builds above every release, an unknown
// version below.
//
// Every write of the control plane goes through Gate.Propose: the gRPC
// services and the leader's loops hold a Gate, not the store.
package gate
