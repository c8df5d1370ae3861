package router

import (
	"bytes"
	"errors"
	"net"
	"net/http"
	"strconv"
)

// A request whose length two headers give two ways — Content-Length and
// Transfer-Encoding: chunked — is the classic request-smuggling vector: a
// proxy in front of the router that frames it by one header and the router
// by the other disagree on where the next request starts. RFC 9112 §6.1
// has a server reject it, or serve it by Transfer-Encoding and close the
// connection; Go's server (to 1.26; golang/go#80942) serves it by
// Transfer-Encoding, drops Content-Length from the headers the handler
// sees, and keeps the connection for the next request. So the router
// watches the framing of each plain-text connection's requests below the
// server, and refuses such a request before the server has read it whole:
// the server answers 400 and closes the connection. The same goes for
// Transfer-Encoding on an HTTP/1.0 request, whose framing RFC 9112 §6.1
// calls faulty (Go ignores the header there).
//
// Over HTTPS the bytes below the server are encrypted, so there the API
// handler closes the connection after every chunked request instead
// (closeChunked): RFC 9112's other answer, for a request it cannot tell
// apart.

// errConflictingFraming is what a refused connection's read returns; the
// server answers any read error other than a timeout, EOF or a network
// error with 400 Bad Request and closes the connection.
var errConflictingFraming = errors.New("request framed both by Content-Length and Transfer-Encoding (or Transfer-Encoding on HTTP/1.0)")

// framingListener gives each accepted connection a framing check.
type framingListener struct {
	net.Listener
	maxHeader int // the server's MaxHeaderBytes, past which it refuses the headers itself
}

func (l framingListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	return &framingConn{Conn: c, p: framing{maxHeader: l.maxHeader + 4096}}, nil
}

// framingConn follows its requests' framing as the server reads them.
type framingConn struct {
	net.Conn
	p   framing
	err error // once a request was refused: every later read fails
}

func (c *framingConn) Read(b []byte) (int, error) {
	if c.err != nil {
		return 0, c.err
	}
	n, err := c.Conn.Read(b)
	if n > 0 {
		if cut, bad := c.p.feed(b[:n]); bad {
			// The server gets the refused request's headers but their end,
			// so it never serves it, and then the error.
			c.err = errConflictingFraming
			if cut == 0 {
				return 0, c.err
			}
			return cut, nil
		}
	}
	return n, err
}

// CloseWrite passes on to the connection's own half-close (see limitConn).
func (c *framingConn) CloseWrite() error {
	if cw, ok := c.Conn.(interface{ CloseWrite() error }); ok {
		return cw.CloseWrite()
	}
	return nil
}

// closeChunked is the API handler over HTTPS, where framingConn cannot see
// the headers: a chunked request's connection is closed after its answer,
// in case it also carried a Content-Length the server dropped.
func closeChunked(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.ProtoMajor == 1 && len(r.TransferEncoding) > 0 {
			w.Header().Set("Connection", "close")
		}
		next.ServeHTTP(w, r)
	})
}

// framing is a request stream's framing as far as the check needs it: where
// each request's headers are, and where its body ends — by Content-Length,
// or by the chunked coding — so that the next request's headers are found.
// It follows what Go's server accepts; on anything that server refuses (a
// malformed line, an unknown coding, headers past the server's limit) it
// stops following, since the server answers that with an error and closes
// the connection itself.
type framing struct {
	maxHeader int

	state     framingState
	line      []byte // the current line, headers and chunk sizes
	header    []byte // the current request's header block
	remaining int64  // body or chunk bytes still to skip
}

type framingState uint8

const (
	stHeader      framingState = iota // reading a request's line and headers
	stBody                            // skipping a Content-Length body
	stChunkSize                       // reading a chunk-size line
	stChunkData                       // skipping a chunk's data
	stChunkCRLF                       // reading the line end after a chunk's data
	stTrailer                         // reading the trailer lines after the last chunk
	stPassthrough                     // stopped following
)

// maxChunkLine bounds a chunk-size line, as Go's chunked reader does.
const maxChunkLine = 4096

// feed follows b, the next bytes read. bad is set when a request's headers,
// which end at b[cut], frame its body both ways; the bytes before cut are
// the server's to read.
func (f *framing) feed(b []byte) (cut int, bad bool) {
	for i := 0; i < len(b); {
		switch f.state {
		case stPassthrough:
			return 0, false
		case stBody, stChunkData:
			n := int64(len(b) - i)
			if n > f.remaining {
				n = f.remaining
			}
			f.remaining -= n
			i += int(n)
			if f.remaining == 0 {
				if f.state == stBody {
					f.state = stHeader
				} else {
					f.state = stChunkCRLF
				}
			}
		case stHeader:
			if len(f.header) == 0 && (b[i] == '\r' || b[i] == '\n') {
				i++ // line ends before a request line: Go skips them after a POST
				continue
			}
			// A line at a time: the block ends with an empty one.
			end := len(b)
			if j := bytes.IndexByte(b[i:], '\n'); j >= 0 {
				end = i + j + 1
			}
			f.header = append(f.header, b[i:end]...)
			i = end
			if len(f.header) > f.maxHeader {
				f.state = stPassthrough // the server refuses it (431)
				continue
			}
			if bytes.HasSuffix(f.header, []byte("\n\n")) || bytes.HasSuffix(f.header, []byte("\n\r\n")) {
				if f.endHeader() {
					return i - 1, true
				}
			}
		default: // the chunked coding's lines
			c := b[i]
			i++
			if f.state == stChunkCRLF {
				if c == '\r' && len(f.line) == 0 {
					f.line = append(f.line, c)
				} else if c == '\n' {
					f.line, f.state = f.line[:0], stChunkSize
				} else {
					f.state = stPassthrough // the server refuses the body
				}
				continue
			}
			if c != '\n' {
				if f.line = append(f.line, c); len(f.line) > maxChunkLine {
					f.state = stPassthrough
				}
				continue
			}
			line := bytes.TrimSuffix(f.line, []byte("\r"))
			f.line = f.line[:0]
			if f.state == stTrailer {
				if len(line) == 0 {
					f.state = stHeader
				}
				continue
			}
			f.chunkSize(line)
		}
	}
	return 0, false
}

// chunkSize reads a chunk-size line: hex digits, then any extension.
func (f *framing) chunkSize(line []byte) {
	if i := bytes.IndexByte(line, ';'); i >= 0 {
		line = line[:i]
	}
	line = bytes.TrimRight(line, " \t")
	n, err := strconv.ParseUint(string(line), 16, 63)
	switch {
	case err != nil:
		f.state = stPassthrough
	case n == 0:
		f.state = stTrailer
	default:
		f.state, f.remaining = stChunkData, int64(n)
	}
}

// endHeader reads the request's header block once whole and sets what
// follows it; true when it frames the body both ways.
func (f *framing) endHeader() (bad bool) {
	block := f.header
	if cap(f.header) > 8<<10 {
		f.header = nil // a large block's buffer is not kept for every later request
	} else {
		f.header = f.header[:0]
	}
	nl := bytes.IndexByte(block, '\n')
	reqLine := bytes.TrimSuffix(block[:nl], []byte("\r"))
	sp := bytes.LastIndexByte(reqLine, ' ')
	if sp < 0 {
		f.state = stPassthrough
		return false
	}
	proto := string(reqLine[sp+1:])
	if proto != "HTTP/1.1" && proto != "HTTP/1.0" {
		f.state = stPassthrough // not a request Go serves as HTTP/1
		return false
	}
	var teBuf, clBuf [2][]byte // most requests have one or neither
	te, cl := teBuf[:0], clBuf[:0]
	for rest := block[nl+1:]; len(rest) > 0; {
		line := rest
		if j := bytes.IndexByte(rest, '\n'); j >= 0 {
			line, rest = rest[:j], rest[j+1:]
		} else {
			rest = nil
		}
		line = bytes.TrimSuffix(line, []byte("\r"))
		if len(line) == 0 || line[0] == ' ' || line[0] == '\t' {
			continue // the end, or a folded line's continuation
		}
		colon := bytes.IndexByte(line, ':')
		if colon < 0 {
			continue
		}
		v := bytes.TrimSpace(line[colon+1:])
		switch name := line[:colon]; {
		case bytes.EqualFold(name, []byte("Content-Length")):
			cl = append(cl, v)
		case bytes.EqualFold(name, []byte("Transfer-Encoding")):
			te = append(te, v)
		}
	}
	switch {
	case len(te) > 0 && (len(cl) > 0 || proto == "HTTP/1.0"):
		return true
	case len(te) > 0:
		if len(te) != 1 || !bytes.EqualFold(te[0], []byte("chunked")) {
			f.state = stPassthrough // the server answers 501 and closes
			return false
		}
		f.state = stChunkSize
	case len(cl) > 0:
		n, err := strconv.ParseInt(string(cl[0]), 10, 64)
		if err != nil || n < 0 || !allEqual(cl) {
			f.state = stPassthrough // the server answers 400 and closes
			return false
		}
		f.state, f.remaining = stBody, n
		if n == 0 {
			f.state = stHeader
		}
	default:
		f.state = stHeader // no body
	}
	return false
}

func allEqual(vs [][]byte) bool {
	for _, v := range vs[1:] {
		if !bytes.Equal(v, vs[0]) {
			return false
		}
	}
	return true
}
