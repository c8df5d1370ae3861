//go:build race

package integration

// raceBuild is true when this test binary is built with -race: the work
// it does in process (fake agents encoding, watchers decoding) runs
// several times slower than in the llmgw binaries it starts, which are
// built without it.
const raceBuild = true
