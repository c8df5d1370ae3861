// Package fakeengine is a stand-in engine for the agent's tests: a test
// binary re-executes itself as one, so the real supervisor runs the real
// drivers' argv against a process whose every behaviour the test chooses.
//
// It records its argv and environment (one JSON line per start, appended to
// the file named by LLMGW_FAKE_ENGINE), serves GET /health on the --host and
// --port it was given, GET /v1/models with one card (the id of
// --served-model-name or --alias, max_model_len from --max-model-len, null
// without one), and exits on SIGTERM. With LLMGW_FAKE_BUSY naming a
// file it also serves vLLM's load gauges on GET /metrics: one request
// running while that file exists, none otherwise. With
// VLLM_SERVER_DEV_MODE=1 it serves vLLM's sleep mode as vLLM does: POST
// /sleep and POST /wake_up answer 200 with no body, GET /is_sleeping
// {"is_sleeping":bool}, and /health stays 200 while asleep; each call is
// recorded (Record.Call); while the file LLMGW_FAKE_SLEEP_FAIL names
// exists, /sleep and /wake_up answer 500 and change nothing.
// LLMGW_FAKE_MODE bends it:
//
//	crash        exit with status 3 shortly after recording
//	ignore-term  ignore SIGTERM (the supervisor must SIGKILL it)
//	child        also start a grandchild in the same process group that
//	             ignores SIGTERM and records its pid (stop must kill the group)
//	unready      never answer /health with 200
package fakeengine

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"os/signal"
	"strings"
	"sync/atomic"
	"syscall"
	"time"
)

// Env names the variables that turn a process into a fake engine.
const (
	EnvRecord    = "LLMGW_FAKE_ENGINE"
	EnvMode      = "LLMGW_FAKE_MODE"
	EnvBusy      = "LLMGW_FAKE_BUSY"
	EnvSleepFail = "LLMGW_FAKE_SLEEP_FAIL"
	envChild     = "LLMGW_FAKE_GRANDCHILD"
)

// Record is one start of the fake engine as it saw itself.
type Record struct {
	Argv []string `json:"argv"`
	Env  []string `json:"env"`
	Pid  int      `json:"pid"`
	// Grandchild is set on the line a grandchild writes.
	Grandchild bool `json:"grandchild,omitempty"`
	// Call is a sleep-mode call the engine answered 200 ("POST
	// /sleep?level=1"), on a line of its own.
	Call string `json:"call,omitempty"`
}

// MaybeRun turns the process into a fake engine when EnvRecord is set, and
// then never returns. Call it first thing in TestMain.
func MaybeRun() {
	path := os.Getenv(EnvRecord)
	if path == "" {
		return
	}
	os.Exit(run(path))
}

func run(path string) int {
	signal.Ignore(syscall.SIGHUP)
	if os.Getenv(envChild) != "" {
		signal.Ignore(syscall.SIGTERM)
		if err := record(path, Record{Pid: os.Getpid(), Grandchild: true}); err != nil {
			return 2
		}
		time.Sleep(time.Hour)
		return 0
	}
	if err := record(path, Record{Argv: os.Args, Env: os.Environ(), Pid: os.Getpid()}); err != nil {
		fmt.Fprintln(os.Stderr, "fake engine:", err)
		return 2
	}
	mode := os.Getenv(EnvMode)
	fmt.Println("fake engine starting in mode", mode)
	term := make(chan os.Signal, 1)
	if mode == "ignore-term" {
		signal.Ignore(syscall.SIGTERM)
	} else {
		signal.Notify(term, syscall.SIGTERM)
	}
	if mode == "crash" {
		time.Sleep(20 * time.Millisecond)
		fmt.Fprintln(os.Stderr, "fake engine: crashing on purpose")
		return 3
	}
	if mode == "child" {
		c := exec.Command(os.Args[0])
		c.Env = append(os.Environ(), envChild+"=1")
		if err := c.Start(); err != nil {
			return 2
		}
	}
	host, port := flag("--host"), flag("--port")
	ln, err := net.Listen("tcp", net.JoinHostPort(host, port))
	if err != nil {
		fmt.Fprintln(os.Stderr, "fake engine: listen:", err)
		return 2
	}
	var asleep atomic.Bool
	devMode := os.Getenv("VLLM_SERVER_DEV_MODE") == "1"
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if devMode && (r.URL.Path == "/sleep" || r.URL.Path == "/wake_up") && r.Method == http.MethodPost {
			if fail := os.Getenv(EnvSleepFail); fail != "" {
				if _, err := os.Stat(fail); err == nil {
					http.Error(w, "injected failure", http.StatusInternalServerError)
					return
				}
			}
			asleep.Store(r.URL.Path == "/sleep")
			_ = record(path, Record{Pid: os.Getpid(), Call: r.Method + " " + r.URL.RequestURI()})
			w.WriteHeader(http.StatusOK)
			return
		}
		if devMode && r.URL.Path == "/is_sleeping" {
			fmt.Fprintf(w, `{"is_sleeping":%v}`, asleep.Load())
			return
		}
		if r.URL.Path == "/health" && mode != "unready" {
			w.WriteHeader(http.StatusOK)
			return
		}
		if r.URL.Path == "/v1/models" && mode != "unready" {
			id := flag("--served-model-name")
			if id == "" {
				id = flag("--alias")
			}
			maxLen := "null"
			if v := flag("--max-model-len"); v != "" {
				maxLen = v
			}
			fmt.Fprintf(w, `{"object":"list","data":[{"id":%q,"object":"model","max_model_len":%s}]}`, id, maxLen)
			return
		}
		if busy := os.Getenv(EnvBusy); r.URL.Path == "/metrics" && busy != "" {
			running := 0
			if _, err := os.Stat(busy); err == nil {
				running = 1
			}
			fmt.Fprintf(w, "vllm:num_requests_running %d\nvllm:num_requests_waiting 0\n", running)
			return
		}
		// vLLM's cache size, when it was set by the flag vLLM takes for it.
		if blocks := flag("--num-gpu-blocks-override"); r.URL.Path == "/metrics" && blocks != "" {
			fmt.Fprintf(w, "vllm:cache_config_info{block_size=\"16\",num_gpu_blocks=%q} 1.0\n", blocks)
			return
		}
		http.Error(w, "not ready", http.StatusServiceUnavailable)
	})}
	go srv.Serve(ln) //nolint:errcheck // the process exits below
	<-term
	fmt.Println("fake engine: SIGTERM, exiting")
	return 0
}

// flag reads an option's value as vLLM does: "--name value" or
// "--name=value" (the drivers write the second, issue 26).
func flag(name string) string {
	for i, a := range os.Args {
		if v, ok := strings.CutPrefix(a, name+"="); ok {
			return v
		}
		if a == name && i+1 < len(os.Args) {
			return os.Args[i+1]
		}
	}
	return ""
}

func record(path string, r Record) error {
	b, err := json.Marshal(r)
	if err != nil {
		return err
	}
	f, err := os.OpenFile(path, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return err
	}
	_, err = f.Write(append(b, '\n'))
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	return err
}

// Read returns every record written to path so far.
func Read(path string) ([]Record, error) {
	b, err := os.ReadFile(path)
	if os.IsNotExist(err) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	var out []Record
	dec := json.NewDecoder(bytes.NewReader(b))
	for dec.More() {
		var r Record
		if err := dec.Decode(&r); err != nil {
			return out, err
		}
		out = append(out, r)
	}
	return out, nil
}
