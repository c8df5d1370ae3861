// Package fsm is llmgw's replicated desired state (design §4): the objects kept
// in Raft, the commands that change them, and snapshot/restore.
//
// Everything here is deterministic: no clock, no randomness, no network and
// no raft import. Every control node applies the same log and must end in
// byte-identical state, so anything that could differ between machines lives
// elsewhere (placement decides in controlplane; the FSM only records).
//
// Validation of a model is pure code here, so llmgwctl, the AdminService and
// the FSM itself refuse exactly the same things.
package fsm
