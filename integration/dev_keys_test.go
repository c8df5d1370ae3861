package integration

import (
	"net/http"
	"strings"
	"testing"
	"time"
)

// TestDevKeysRequiredCanBeUndone (issue 28, part 6): tried as a newcomer
// would, one `llmgwctl apikey create` in `llmgw dev` locked the dev cluster
// behind keys for good, and said nothing. Now dev says at start whether
// keys are required, create says what it turned on and how to undo it,
// and `llmgwctl apikey require off` serves requests without a key again
// while the key still works.
func TestDevKeysRequiredCanBeUndone(t *testing.T) {
	d := startDev(t)
	if !eventually(10*time.Second, func() bool { return strings.Contains(d.log.String(), "API keys are not required") }) {
		t.Errorf("dev did not say at start whether keys are required:\n%s", tail(d.log.String(), 20))
	}
	out, err := d.ctl("apikey", "create", "me")
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out, "keys are now required") || !strings.Contains(out, "llmgwctl apikey require off") {
		t.Errorf("apikey create does not say what it turned on:\n%s", out)
	}
	lines := strings.Split(strings.TrimSpace(out), "\n")
	secret := lines[len(lines)-1]
	var code int
	var body string
	if !eventually(10*time.Second, func() bool { code, body = chatAs(d.http, "demo", ""); return code == http.StatusUnauthorized }) {
		t.Fatalf("no key after the first key: %d %s, want 401", code, body)
	}
	if out, err := d.ctl("apikey", "list"); err != nil || !strings.Contains(out, "keys required: on") {
		t.Errorf("apikey list: %v\n%s", err, out)
	}
	out, err = d.ctl("apikey", "require", "off")
	if err != nil || !strings.Contains(out, "keys required off") {
		t.Fatalf("apikey require off: %v\n%s", err, out)
	}
	if !eventually(10*time.Second, func() bool { code, body = chatAs(d.http, "demo", ""); return code == http.StatusOK }) {
		t.Fatalf("no key after require off: %d %s, want 200", code, body)
	}
	if code, body := chatAs(d.http, "demo", secret); code != http.StatusOK {
		t.Errorf("the key after require off: %d %s, want 200", code, body)
	}
	if code, body := chatAs(d.http, "demo", "sk-llmgw-not-a-key"); code != http.StatusUnauthorized {
		t.Errorf("a wrong key after require off: %d %s, want 401 (a key presented is still checked)", code, body)
	}
}
