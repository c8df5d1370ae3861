package integration

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"
)

// TestDevServesOpenAI drives `llmgw dev` with the official OpenAI Go client:
// a chat completion, a streamed one whose chunks arrive one by one, a
// completion and the model list. Shutdown then leaves no engine behind.
func TestDevServesOpenAI(t *testing.T) {
	d := startDev(t)
	client := openai.NewClient(option.WithBaseURL("http://"+d.http+"/v1"), option.WithAPIKey("unused"), option.WithMaxRetries(0))
	ctx, cancel := context.WithTimeout(context.Background(), within(60*time.Second))
	defer cancel()

	t.Run("says when demo is ready", func(t *testing.T) {
		// startDev waited for a ready replica to answer; dev's note follows
		// within a tick of its router seeing both.
		if !eventually(within(10*time.Second), func() bool { return strings.Contains(d.log.String(), "demo is ready to serve") }) {
			t.Fatalf("dev never logged %q with both replicas routable:\n%s", "demo is ready to serve", tail(d.log.String(), 20))
		}
	})

	t.Run("chat completion", func(t *testing.T) {
		resp, err := client.Chat.Completions.New(ctx, openai.ChatCompletionNewParams{
			Model:    "demo",
			Messages: []openai.ChatCompletionMessageParamUnion{openai.UserMessage("Say hello")},
		})
		if err != nil {
			t.Fatal(err)
		}
		if len(resp.Choices) != 1 || resp.Choices[0].Message.Content == "" {
			t.Fatalf("choices = %+v", resp.Choices)
		}
		if resp.Usage.PromptTokens == 0 || resp.Usage.CompletionTokens == 0 {
			t.Fatalf("usage = %+v", resp.Usage)
		}
	})

	t.Run("streamed chat arrives chunk by chunk", func(t *testing.T) {
		const tokens = 12
		stream := client.Chat.Completions.NewStreaming(ctx, openai.ChatCompletionNewParams{
			Model:     "demo",
			Messages:  []openai.ChatCompletionMessageParamUnion{openai.UserMessage("Tell me a story")},
			MaxTokens: openai.Int(tokens),
		})
		var arrivals []time.Time
		var text strings.Builder
		for stream.Next() {
			c := stream.Current()
			if len(c.Choices) > 0 && c.Choices[0].Delta.Content != "" {
				arrivals = append(arrivals, time.Now())
				text.WriteString(c.Choices[0].Delta.Content)
			}
		}
		if err := stream.Err(); err != nil {
			t.Fatal(err)
		}
		if len(arrivals) < tokens/2 {
			t.Fatalf("%d content chunks, want about %d", len(arrivals), tokens)
		}
		// Each token takes the simulator's decode latency (dev sets 20 ms).
		// Chunks buffered until the end would all arrive within a few
		// milliseconds of each other; passed through, they are spread over
		// the whole generation. The bound is a lower one, so a slow machine
		// cannot make it fail.
		spread := arrivals[len(arrivals)-1].Sub(arrivals[0])
		if min := time.Duration(len(arrivals)-1) * 20 * time.Millisecond / 2; spread < min {
			t.Fatalf("chunks arrived within %v of each other, want at least %v: the stream was buffered", spread, min)
		}
	})

	t.Run("completion", func(t *testing.T) {
		resp, err := client.Completions.New(ctx, openai.CompletionNewParams{
			Model:     openai.CompletionNewParamsModel("demo"),
			Prompt:    openai.CompletionNewParamsPromptUnion{OfString: openai.String("Once upon a time")},
			MaxTokens: openai.Int(8),
		})
		if err != nil {
			t.Fatal(err)
		}
		if len(resp.Choices) != 1 || resp.Choices[0].Text == "" {
			t.Fatalf("choices = %+v", resp.Choices)
		}
	})

	t.Run("model list", func(t *testing.T) {
		page, err := client.Models.List(ctx)
		if err != nil {
			t.Fatal(err)
		}
		var ids []string
		for _, m := range page.Data {
			ids = append(ids, m.ID)
		}
		if len(ids) != 1 || ids[0] != "demo" {
			t.Fatalf("models = %v, want [demo]", ids)
		}
	})

	t.Run("router reads load from the agent's stream", func(t *testing.T) {
		// The agent registers its LoadService address with its node; the
		// router subscribes there instead of scraping every engine itself.
		ok := eventually(10*time.Second, func() bool {
			resp, err := http.Get("http://" + d.ops + "/metrics")
			if err != nil {
				return false
			}
			defer resp.Body.Close()
			var buf strings.Builder
			_, _ = io.Copy(&buf, resp.Body)
			return strings.Contains(buf.String(), "\nllmgw_router_load_subscriptions 1\n")
		})
		if !ok {
			t.Fatal("the router has no load subscription to the dev agent")
		}
	})

	pids := enginePIDs(t, d)
	if err := d.stop(); err != nil {
		t.Fatal(err)
	}
	for _, pid := range pids {
		if alive(pid) {
			t.Errorf("engine pid %d outlived llmgw dev", pid)
		}
	}
}

// TestEngineKilledUnderTraffic kills one replica's engine while clients keep
// sending: every request still succeeds through the other replica, and the
// agent starts the killed engine again as a new incarnation.
func TestEngineKilledUnderTraffic(t *testing.T) {
	d := startDev(t)
	before := d.modelReplicas("demo")
	victim := before[0]

	var sent, failed atomic.Int64
	var firstErr atomic.Value
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				select {
				case <-stop:
					return
				default:
				}
				code, body := d.post("/v1/chat/completions", `{"model":"demo","messages":[{"role":"user","content":"keep going"}],"max_tokens":4}`)
				sent.Add(1)
				if code != http.StatusOK {
					failed.Add(1)
					firstErr.CompareAndSwap(nil, fmt.Sprintf("%d %s", code, body))
				}
			}
		}()
	}
	// Traffic before the kill.
	if !eventually(10*time.Second, func() bool { return sent.Load() >= 10 }) {
		t.Fatalf("only %d requests answered within %v before the kill", sent.Load(), within(10*time.Second))
	}
	if err := syscall.Kill(victim.Status.PID, syscall.SIGKILL); err != nil {
		t.Fatalf("kill engine %d: %v", victim.Status.PID, err)
	}
	restarted := eventually(60*time.Second, func() bool {
		for _, r := range d.modelReplicas("demo") {
			if r.Replica.ID == victim.Replica.ID && r.ready() && r.Status.PID != victim.Status.PID {
				return r.Status.Incarnation != victim.Status.Incarnation && r.Status.Restarts > victim.Status.Restarts
			}
		}
		return false
	})
	// Traffic over the restarted replica too.
	base := sent.Load()
	more := restarted && eventually(10*time.Second, func() bool { return sent.Load() >= base+10 })
	close(stop)
	wg.Wait()
	if !restarted {
		t.Fatalf("replica %s was not restarted as a new incarnation within %v", victim.Replica.ID, within(60*time.Second))
	}
	if !more {
		t.Fatalf("only %d requests answered within %v after the restart", sent.Load()-base, within(10*time.Second))
	}
	if n := failed.Load(); n > 0 {
		t.Fatalf("%d of %d requests failed while an engine was killed; first: %v", n, sent.Load(), firstErr.Load())
	}
	if sent.Load() < 10 {
		t.Fatalf("only %d requests sent: the test did not exercise the router", sent.Load())
	}
}

// TestModelApplyAndDelete applies a second model with llmgwctl (using the
// vllm driver against the simulator, so that driver runs for real), serves
// it, then deletes it and checks its engine is gone and the router refuses it.
// The router's card of it carries the engine's max_model_len, as the agent
// read it from the engine's own card (issue 27).
func TestModelApplyAndDelete(t *testing.T) {
	d := startDev(t, "--vllm-command", bins.llmgw+" sim")
	file := filepath.Join(t.TempDir(), "second.yaml")
	writeFile(t, file, "name: second\nengine: vllm\nmodel: Qwen/Qwen2.5-0.5B-Instruct\nreplicas: 1\ngpus_per_replica: 1\n"+
		"extra_args: [\"--sim-decode-ms-per-token\", \"1\", \"--max-model-len\", \"4096\"]\n")
	if out, err := d.ctl("model", "apply", "-f", file); err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	ready := d.waitReady("second", 1, 60*time.Second)
	var card struct {
		ID          string `json:"id"`
		MaxModelLen *int   `json:"max_model_len"`
	}
	if !eventually(10*time.Second, func() bool {
		card.MaxModelLen = nil
		code, body := d.get("/v1/models/second")
		return code == http.StatusOK && json.Unmarshal(body, &card) == nil && card.MaxModelLen != nil
	}) || card.ID != "second" || *card.MaxModelLen != 4096 {
		t.Fatalf("router's card of second: %+v, want max_model_len 4096", card)
	}
	code, body := d.post("/v1/chat/completions", `{"model":"second","messages":[{"role":"user","content":"hi"}]}`)
	if code != http.StatusOK {
		t.Fatalf("chat with the second model: %d %s", code, body)
	}
	var chat struct{ Model string }
	if err := json.Unmarshal(body, &chat); err != nil || chat.Model != "second" {
		t.Fatalf("answer names model %q (%v), want second", chat.Model, err)
	}

	if out, err := d.ctl("model", "delete", "second"); err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	pid := ready[0].Status.PID
	if !eventually(30*time.Second, func() bool { return len(d.modelReplicas("second")) == 0 && !alive(pid) }) {
		t.Fatalf("replicas of the deleted model or its engine (pid %d) remain", pid)
	}
	var lastCode int
	var lastBody []byte
	if !eventually(10*time.Second, func() bool {
		lastCode, lastBody = d.post("/v1/chat/completions", `{"model":"second","messages":[{"role":"user","content":"hi"}]}`)
		return lastCode == http.StatusNotFound
	}) {
		t.Fatalf("the router still knows the deleted model: %d %s", lastCode, lastBody)
	}
	if !d.chatOK("demo") {
		t.Fatal("demo stopped answering after another model was deleted")
	}
}

// TestBadInput checks each kind of bad request gets its status and an OpenAI
// error body, and that a bad model file is refused naming the field with
// nothing written.
func TestBadInput(t *testing.T) {
	d := startDev(t)
	big := `{"model":"demo","messages":[{"role":"user","content":"` + strings.Repeat("x", 9<<20) + `"}]}`
	for _, tc := range []struct {
		name string
		body string
		code int
	}{
		{"malformed JSON", `{"model":"demo",`, http.StatusBadRequest},
		{"unknown model", `{"model":"nope","messages":[{"role":"user","content":"hi"}]}`, http.StatusNotFound},
		{"oversized body", big, http.StatusRequestEntityTooLarge},
	} {
		t.Run(tc.name, func(t *testing.T) {
			code, body := d.post("/v1/chat/completions", tc.body)
			if code != tc.code {
				t.Fatalf("status %d, want %d: %s", code, tc.code, body)
			}
			var e struct {
				Error *struct {
					Message string `json:"message"`
					Type    string `json:"type"`
				} `json:"error"`
			}
			if err := json.Unmarshal(body, &e); err != nil || e.Error == nil || e.Error.Message == "" || e.Error.Type == "" {
				t.Fatalf("not an OpenAI error body: %s", body)
			}
		})
	}

	t.Run("bad model file", func(t *testing.T) {
		before, err := d.ctl("model", "list", "-o", "json")
		if err != nil {
			t.Fatal(err)
		}
		file := filepath.Join(t.TempDir(), "bad.yaml")
		writeFile(t, file, "name: third\nengine: sim\nmodel: m\nreplicas: -2\n")
		out, err := d.ctl("model", "apply", "-f", file)
		if err == nil || !strings.Contains(out, "replicas") {
			t.Fatalf("apply of a bad file: err=%v output=%q, want an error naming replicas", err, out)
		}
		after, err := d.ctl("model", "list", "-o", "json")
		if err != nil {
			t.Fatal(err)
		}
		if before != after {
			t.Fatalf("a refused model file changed the model list:\n%s\n%s", before, after)
		}
	})
}

func enginePIDs(t *testing.T, d *devProcess) []int {
	t.Helper()
	var pids []int
	for _, r := range d.modelReplicas("demo") {
		if r.Status != nil && r.Status.PID > 0 {
			pids = append(pids, r.Status.PID)
		}
	}
	if len(pids) == 0 {
		t.Fatal("no engine pids reported")
	}
	return pids
}

func writeFile(t *testing.T, path, content string) {
	t.Helper()
	if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
}
