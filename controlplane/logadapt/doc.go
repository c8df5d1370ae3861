// Package logadapt re-logs the output of the hashicorp libraries the control
// plane embeds — raft and raft-autopilot (hclog), memberlist (the standard
// log package), and net/http's server errors — through the node's slog
// logger, so their lines share the process's format, levels and keys
// (design §9), and rate-limits their repeated warnings and errors, which a
// peer's junk — silent sockets, forged UDP packets — would otherwise turn
// into one line each (issue 26).
//
// Why a package of its own: the Raft store (package store) and the
// membership (package cluster, package gossip) each embed one of these
// libraries; one adapter for all keeps a key renamed here renamed
// everywhere, and keeps those packages from importing each other for it.
package logadapt
