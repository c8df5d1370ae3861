//go:build llmgw_upgrade_old

package controlplane

// asPreviousRelease is true: this build plays the previous release in the
// upgrade test (release.go).
const asPreviousRelease = true
