//go:build !llmgw_upgrade_old

package controlplane

// asPreviousRelease is false: this build is this release (release.go).
const asPreviousRelease = false
