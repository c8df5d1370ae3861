// Command bench-proxy is the baseline of scripts/bench-proxy.sh: the
// plainest Go reverse proxy, net/http/httputil's with a transport sized as
// the router's, in front of one upstream. What the router costs beyond it
// is the router's own work (design §7.1).
package main

import (
	"flag"
	"log"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"time"
)

func main() {
	listen := flag.String("listen", "127.0.0.1:36003", "address to serve on (loopback)")
	upstream := flag.String("upstream", "http://127.0.0.1:36001", "engine base URL")
	flag.Parse()
	u, err := url.Parse(*upstream)
	if err != nil {
		log.Fatalf("--upstream: %v", err)
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
