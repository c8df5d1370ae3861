package integration

import (
	"bufio"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"regexp"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/coder/websocket"
)

// browser is a headless Chromium driven over the DevTools protocol on a
// loopback websocket: one process for a whole test, pages navigated,
// evaluated and captured in it, which is both faster and more exact than
// one `chromium --screenshot` per page (the test waits for what the page
// shows, not for a virtual-time budget).
//
// Chromium talks to nothing but loopback: every other host name resolves
// to nothing (--host-resolver-rules) and any other address would go to a
// proxy on a closed loopback port; its background services (updates,
// sync, safe browsing) are switched off.
type browser struct {
	t    *testing.T
	cmd  *exec.Cmd
	conn *websocket.Conn
	done chan struct{} // closed when the reader stops

	mu      sync.Mutex
	nextID  int
	waiting map[int]chan cdpReply
}

type cdpReply struct {
	Result json.RawMessage `json:"result"`
	Error  *struct {
		Message string `json:"message"`
	} `json:"error"`
}

// chromiumPath is Debian's chromium, or the test is skipped (failed when
// CI is set: CI installs it, .ci/run).
func chromiumPath(t *testing.T) string {
	t.Helper()
	for _, name := range []string{"chromium", "chromium-browser"} {
		if p, err := exec.LookPath(name); err == nil {
			return p
		}
	}
	if ci := os.Getenv("CI"); ci != "" && ci != "0" && !strings.EqualFold(ci, "false") {
		t.Fatal("chromium is not installed, and CI is set: .ci/run installs it (apt-get install chromium)")
	}
	t.Skip("chromium is not installed: apt-get install chromium to run the browser test (under CI=true its absence fails)")
	return ""
}

var devtoolsRE = regexp.MustCompile(`DevTools listening on (ws://127\.0\.0\.1:\d+/\S+)`)

// startBrowser starts headless Chromium at width×height and connects to
// its first page.
func startBrowser(t *testing.T, width, height int) *browser {
	t.Helper()
	bin := chromiumPath(t)
	ctx, cancel := context.WithTimeout(context.Background(), within(30*time.Second))
	defer cancel()
	cmd := exec.Command(bin, "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
		"--user-data-dir="+t.TempDir(), "--no-first-run", "--no-default-browser-check",
		"--disable-background-networking", "--disable-component-update", "--disable-sync", "--disable-extensions",
		"--disable-default-apps", "--disable-domain-reliability", "--no-pings", "--metrics-recording-only",
		"--proxy-server=127.0.0.1:9", "--host-resolver-rules=MAP * ~NOTFOUND, EXCLUDE 127.0.0.1",
		"--hide-scrollbars", "--remote-debugging-address=127.0.0.1", "--remote-debugging-port=0",
		fmt.Sprintf("--window-size=%d,%d", width, height), "about:blank")
	// Its own process group: close ends the renderers and helpers it forks
	// with it.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatalf("start %s: %v", bin, err)
	}
	b := &browser{t: t, cmd: cmd, done: make(chan struct{}), waiting: map[int]chan cdpReply{}}
	t.Cleanup(b.close)
	found := make(chan string, 1)
	var logMu sync.Mutex
	var log strings.Builder
	go func() {
		sc := bufio.NewScanner(stderr)
		for sc.Scan() {
			logMu.Lock()
			log.WriteString(sc.Text() + "\n")
			logMu.Unlock()
			if m := devtoolsRE.FindStringSubmatch(sc.Text()); m != nil {
				select {
				case found <- m[1]:
				default:
				}
			}
		}
	}()
	var browserURL string
	select {
	case browserURL = <-found:
	case <-ctx.Done():
		logMu.Lock()
		defer logMu.Unlock()
		t.Fatalf("chromium did not open its DevTools port within %v:\n%s", within(30*time.Second), tail(log.String(), 20))
	}
	// The first page's own websocket, from the DevTools HTTP listing.
	host := strings.TrimPrefix(browserURL, "ws://")
	host = host[:strings.IndexByte(host, '/')]
	pageURL, err := firstPage(ctx, host)
	if err != nil {
		t.Fatal(err)
	}
	conn, _, err := websocket.Dial(ctx, pageURL, nil)
	if err != nil {
		t.Fatalf("connect to chromium's page %s: %v", pageURL, err)
	}
	conn.SetReadLimit(64 << 20) // screenshots
	b.conn = conn
	go b.read()
	b.call("Emulation.setDeviceMetricsOverride", map[string]any{"width": width, "height": height, "deviceScaleFactor": 1, "mobile": false}, nil)
	return b
}

func firstPage(ctx context.Context, host string) (string, error) {
	for {
		req, _ := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+host+"/json/list", nil)
		resp, err := http.DefaultClient.Do(req)
		if err == nil {
			var targets []struct {
				Type string `json:"type"`
				WS   string `json:"webSocketDebuggerUrl"`
			}
			err = json.NewDecoder(resp.Body).Decode(&targets)
			resp.Body.Close()
			for _, tg := range targets {
				if tg.Type == "page" && tg.WS != "" {
					return tg.WS, nil
				}
			}
		}
		select {
		case <-ctx.Done():
			return "", fmt.Errorf("no page target in chromium's DevTools listing at %s (last error: %w)", host, err)
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// read dispatches replies to their callers and drops events.
func (b *browser) read() {
	defer close(b.done)
	for {
		_, msg, err := b.conn.Read(context.Background())
		if err != nil {
			b.mu.Lock()
			for id, ch := range b.waiting {
				close(ch)
				delete(b.waiting, id)
			}
			b.mu.Unlock()
			return
		}
		var m struct {
			ID int `json:"id"`
			cdpReply
		}
		if json.Unmarshal(msg, &m) != nil || m.ID == 0 {
			continue
		}
		b.mu.Lock()
		ch := b.waiting[m.ID]
		delete(b.waiting, m.ID)
		b.mu.Unlock()
		if ch != nil {
			ch <- m.cdpReply
		}
	}
}

// call runs one DevTools method and decodes its result into out (nil:
// ignored); it fails the test on an error.
func (b *browser) call(method string, params any, out any) {
	b.t.Helper()
	if err := b.try(method, params, out); err != nil {
		b.t.Fatal(err)
	}
}

func (b *browser) try(method string, params any, out any) error {
	b.mu.Lock()
	b.nextID++
	id := b.nextID
	ch := make(chan cdpReply, 1)
	b.waiting[id] = ch
	b.mu.Unlock()
	msg, _ := json.Marshal(map[string]any{"id": id, "method": method, "params": params})
	ctx, cancel := context.WithTimeout(context.Background(), within(20*time.Second))
	defer cancel()
	if err := b.conn.Write(ctx, websocket.MessageText, msg); err != nil {
		return fmt.Errorf("%s: %w", method, err)
	}
	select {
	case r, ok := <-ch:
		if !ok {
			return fmt.Errorf("%s: chromium closed the connection", method)
		}
		if r.Error != nil {
			return fmt.Errorf("%s: %s", method, r.Error.Message)
		}
		if out != nil {
			return json.Unmarshal(r.Result, out)
		}
		return nil
	case <-ctx.Done():
		return fmt.Errorf("%s: no answer from chromium within %v", method, within(20*time.Second))
	}
}

// navigate opens url in the page.
func (b *browser) navigate(url string) {
	b.t.Helper()
	b.call("Page.navigate", map[string]any{"url": url}, nil)
}

// eval evaluates a JavaScript expression in the page and returns its value
// as JSON.
func (b *browser) eval(expr string) (json.RawMessage, error) {
	var r struct {
		Result struct {
			Value json.RawMessage `json:"value"`
		} `json:"result"`
		ExceptionDetails *struct {
			Text string `json:"text"`
		} `json:"exceptionDetails"`
	}
	if err := b.try("Runtime.evaluate", map[string]any{"expression": expr, "returnByValue": true}, &r); err != nil {
		return nil, err
	}
	if r.ExceptionDetails != nil {
		return nil, errors.New(r.ExceptionDetails.Text)
	}
	return r.Result.Value, nil
}

// dom is the page's rendered DOM (what --dump-dom prints) once its body's
// data-rendered attribute says page has been drawn from its JSON.
func (b *browser) dom(page string) (string, bool) {
	v, err := b.eval(`document.body && document.body.dataset.rendered === ` + jsString(page) + ` ? document.documentElement.outerHTML : ""`)
	if err != nil {
		return "", false
	}
	var s string
	if json.Unmarshal(v, &s) != nil || s == "" {
		return "", false
	}
	return s, true
}

// screenshot saves the page as a PNG at path.
func (b *browser) screenshot(path string) {
	b.t.Helper()
	var r struct {
		Data string `json:"data"`
	}
	b.call("Page.captureScreenshot", map[string]any{"format": "png"}, &r)
	png, err := base64.StdEncoding.DecodeString(r.Data)
	if err != nil {
		b.t.Fatal(err)
	}
	if err := os.WriteFile(path, png, 0o644); err != nil {
		b.t.Fatal(err)
	}
}

func (b *browser) close() {
	if b.conn != nil {
		b.conn.Close(websocket.StatusNormalClosure, "")
		<-b.done
	}
	_ = syscall.Kill(-b.cmd.Process.Pid, syscall.SIGKILL)
	_ = b.cmd.Wait()
}

func jsString(s string) string {
	b, _ := json.Marshal(s)
	return string(b)
}
