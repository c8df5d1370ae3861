package replicas

import (
	"strings"
	"testing"
)

func TestParseEngineRecord(t *testing.T) {
	good := `{"replica_id":"demo-0","uid":2,"incarnation":1,"pid":4242,"pid_start":99,` +
		`"address":"127.0.0.1:31000","health_url":"http://127.0.0.1:31000/health","ports":{"http":31000},` +
		`"replica":{"id":"demo-0","uid":"2","model":"demo"},"model":{"name":"demo","engine":"sim"}}`
	tests := []struct {
		name, in, wantErr string
	}{
		{"good", good, ""},
		{"not json", "{", "engine record"},
		{"no replica id", `{"pid":4242}`, "replica_id"},
		{"pid 1", strings.Replace(good, `"pid":4242`, `"pid":1`, 1), "pid"},
		{"no start time", strings.Replace(good, `"pid_start":99`, `"pid_start":0`, 1), "pid_start"},
		{"incarnation 0", strings.Replace(good, `"incarnation":1`, `"incarnation":0`, 1), "incarnation"},
		{"health url", strings.Replace(good, `http://127.0.0.1:31000/health`, `/health`, 1), "health_url"},
		{"port", strings.Replace(good, `{"http":31000}`, `{"http":70000}`, 1), "ports"},
		{"replica mismatch", strings.Replace(good, `"uid":"2"`, `"uid":"3"`, 1), "does not match"},
		{"model mismatch", strings.Replace(good, `"name":"demo"`, `"name":"other"`, 1), "model"},
		{"bad replica", strings.Replace(good, `"uid":"2"`, `"uid":"x"`, 1), "replica"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r, err := parseEngineRecord([]byte(tt.in))
			if tt.wantErr == "" {
				if err != nil || r.replica.GetUid() != 2 || r.model.GetEngine() != "sim" {
					t.Fatalf("parse: %v, %+v", err, r)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
				t.Errorf("error %v, want one naming %q", err, tt.wantErr)
			}
		})
	}
}

func FuzzParseEngineRecord(f *testing.F) {
	f.Add([]byte(`{"replica_id":"demo-0","uid":2,"incarnation":1,"pid":4242,"pid_start":99,"health_url":"http://x/health",` +
		`"replica":{"id":"demo-0","uid":"2","model":"demo"},"model":{"name":"demo"}}`))
	f.Add([]byte(`{}`))
	f.Add([]byte(`[`))
	f.Fuzz(func(t *testing.T, b []byte) {
		r, err := parseEngineRecord(b)
		if err == nil && (r.PID <= 1 || r.replica.GetId() != r.ReplicaID) {
			t.Fatalf("accepted a record that names no engine: %+v", r)
		}
	})
}
