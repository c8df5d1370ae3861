// Command bench-proxy is the baseline of scripts/bench-proxy.sh: the
// plainest Go reverse proxy, net/http/httputil's with a transport sized as
// the router's, in front of one upstream. What the router costs beyond it
// is the router's own work (design §7.1).
//
// With --raw it is instead the floor of any Go proxy: no net/http server
// and no Transport, one goroutine per client connection that reads a
// request, sends it on its own kept-alive engine connection, and copies
// the answer back — no per-request goroutine, no background read watching
// for the client going away, no header maps beyond what http.ReadRequest
// and http.ReadResponse build. What the net/http proxy and the router pay
// beyond it is net/http's; what it pays beyond nginx is Go's runtime.
// It handles only what the bench sends (POST with a sized body; answers
// sized or chunked) and is not a proxy to deploy.
package main

import (
	"bufio"
	"errors"
	"flag"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"strconv"
	"time"
)

func main() {
	listen := flag.String("listen", "127.0.0.1:36003", "address to serve on (loopback)")
	upstream := flag.String("upstream", "http://127.0.0.1:36001", "engine base URL")
	raw := flag.Bool("raw", false, "serve with a minimal HTTP/1.1 loop instead of net/http (the Go runtime's floor)")
	flag.Parse()
	u, err := url.Parse(*upstream)
	if err != nil {
		log.Fatalf("--upstream: %v", err)
	}
	if *raw {
		log.Fatal(serveRaw(*listen, u.Host))
	}
	rp := httputil.NewSingleHostReverseProxy(u)
	rp.Transport = &http.Transport{
		DialContext:         (&net.Dialer{Timeout: 2 * time.Second, KeepAlive: 30 * time.Second}).DialContext,
		MaxIdleConnsPerHost: 64,
		IdleConnTimeout:     90 * time.Second,
		DisableCompression:  true,
	}
	// FlushInterval stays 0: httputil flushes text/event-stream and
	// unsized answers at once by itself, and buffers sized ones, as a
	// plain proxy should.
	srv := &http.Server{Addr: *listen, Handler: rp, ReadHeaderTimeout: 10 * time.Second}
	log.Fatal(srv.ListenAndServe())
}

// serveRaw accepts on listen and serves each connection with rawConn.
func serveRaw(listen, upstream string) error {
	ln, err := net.Listen("tcp", listen)
	if err != nil {
		return err
	}
	for {
		c, err := ln.Accept()
		if err != nil {
			return err
		}
		go func() {
			if err := rawConn(c, upstream); err != nil && !errors.Is(err, io.EOF) {
				log.Printf("raw: %v", err)
			}
		}()
	}
}

// rawConn proxies c's requests, one at a time, over one engine connection
// of its own.
func rawConn(c net.Conn, upstream string) error {
	defer c.Close()
	e, err := net.Dial("tcp", upstream)
	if err != nil {
		return err
	}
	defer e.Close()
	cr, cw := bufio.NewReader(c), bufio.NewWriter(c)
	er, ew := bufio.NewReader(e), bufio.NewWriter(e)
	for {
		req, err := http.ReadRequest(cr)
		if err != nil {
			return err
		}
		fmt.Fprintf(ew, "%s %s HTTP/1.1\r\nHost: %s\r\nContent-Type: %s\r\nContent-Length: %d\r\n\r\n",
			req.Method, req.URL.RequestURI(), upstream, req.Header.Get("Content-Type"), req.ContentLength)
		if _, err := io.Copy(ew, req.Body); err != nil {
			return err
		}
		if err := ew.Flush(); err != nil {
			return err
		}
		resp, err := http.ReadResponse(er, req)
		if err != nil {
			return err
		}
		if err := copyAnswer(cw, resp); err != nil {
			return err
		}
	}
}

// copyAnswer writes resp to w: a sized body as one write, an unsized one
// chunk by chunk as the engine's reads deliver it, each flushed.
func copyAnswer(w *bufio.Writer, resp *http.Response) error {
	defer resp.Body.Close()
	fmt.Fprintf(w, "HTTP/1.1 %s\r\nContent-Type: %s\r\n", resp.Status, resp.Header.Get("Content-Type"))
	if resp.ContentLength >= 0 {
		fmt.Fprintf(w, "Content-Length: %d\r\n\r\n", resp.ContentLength)
		if _, err := io.Copy(w, resp.Body); err != nil {
			return err
		}
		return w.Flush()
	}
	w.WriteString("Transfer-Encoding: chunked\r\n\r\n")
	buf := make([]byte, 32<<10)
	for {
		n, err := resp.Body.Read(buf)
		if n > 0 {
			w.WriteString(strconv.FormatInt(int64(n), 16) + "\r\n")
			w.Write(buf[:n])
			w.WriteString("\r\n")
			if ferr := w.Flush(); ferr != nil {
				return ferr
			}
		}
		if err == io.EOF {
			w.WriteString("0\r\n\r\n")
			return w.Flush()
		}
		if err != nil {
			return err
		}
	}
}
