package main

// The fake backend: Ollama's /api/chat as NDJSON streams, the bytes mock/ sends with
// stream_tick_ms (mock/ticker.py): the head at once, the first token at exactly TTFT,
// then one token every tok_ms written by one shared ticker (wheel.go), then the final
// `"done": true` line and the end of the chunked body. The GET routes the router's
// discovery asks for (/api/version, /api/tags, /api/ps, /v1/models) answer as mock/ does.

import (
	"bytes"
	"errors"
	"flag"
	"fmt"
	"net"
	"os"
	"strconv"
	"time"
)

type serveConfig struct {
	ttft, tok time.Duration
	tokens    int // the answer's length when the request asks for no fewer
	models    []string
}

func serveMain(args []string) {
	fs := flag.NewFlagSet("serve", flag.ExitOnError)
	host := fs.String("host", "127.0.0.1", "address to listen on")
	port := fs.Int("port", 0, "port (0: a free one; the port is printed on stdout)")
	ttftMs := fs.Float64("ttft-ms", 50, "ms to the first token")
	tokMs := fs.Float64("tok-ms", 40, "ms per token after the first")
	tokens := fs.Int("tokens", 100, "tokens per answer (fewer when num_predict asks)")
	tickMs := fs.Float64("tick-ms", 5, "the shared ticker's period (token deadlines are rounded up to it)")
	model := fs.String("model", "llama3", "the model the discovery routes list")
	_ = fs.Parse(args)
	if *tickMs <= 0 {
		fail("--tick-ms must be > 0")
	}
	cfg := &serveConfig{ttft: ms(*ttftMs), tok: ms(*tokMs), tokens: *tokens, models: []string{*model}}
	ln, err := net.Listen("tcp", net.JoinHostPort(*host, strconv.Itoa(*port)))
	if err != nil {
		fail("listen: %v", err)
	}
	fmt.Fprintln(os.Stdout, ln.Addr().(*net.TCPAddr).Port)
	w := newWheel(ms(*tickMs))
	go w.run()
	for {
		c, err := ln.Accept()
		if err != nil {
			fail("accept: %v", err)
		}
		go serveConn(c.(*net.TCPConn), cfg, w)
	}
}

func ms(v float64) time.Duration { return time.Duration(v * float64(time.Millisecond)) }

// serveConn answers one keep-alive connection's requests, one at a time.
func serveConn(c *net.TCPConn, cfg *serveConfig, w *wheel) {
	defer c.Close()
	fd := -1
	if raw, err := c.SyscallConn(); err == nil {
		_ = raw.Control(func(f uintptr) { fd = int(f) })
	}
	r := &reqReader{c: c, buf: make([]byte, 0, 4096)}
	for {
		req, err := r.next()
		if err != nil {
			return
		}
		arrived := time.Now()
		if req.method == "GET" {
			if _, err := c.Write(getReply(req.path, cfg)); err != nil || req.close {
				return
			}
			continue
		}
		if req.method != "POST" || req.path != "/api/chat" {
			if _, err := c.Write(reply(404, `{"error": "slowgen serves POST /api/chat streams only"}`)); err != nil || req.close {
				return
			}
			continue
		}
		s, head := newStream(fd, req, cfg, arrived)
		if _, err := c.Write(head); err != nil {
			return
		}
		time.Sleep(time.Until(arrived.Add(cfg.ttft)))
		w.start(s)
		if err := <-s.done; err != nil || req.close {
			return
		}
	}
}

type request struct {
	method, path string
	body         []byte
	close        bool
}

// reqReader parses requests with a Content-Length body (what the router and the load
// client send) from one connection.
type reqReader struct {
	c   net.Conn
	buf []byte
}

var errTooBig = errors.New("request head too big")

func (r *reqReader) next() (*request, error) {
	end := -1
	for {
		if end = bytes.Index(r.buf, []byte("\r\n\r\n")); end >= 0 {
			break
		}
		if len(r.buf) > 64<<10 {
			return nil, errTooBig
		}
		if err := r.fill(); err != nil {
			return nil, err
		}
	}
	lines := bytes.Split(r.buf[:end], []byte("\r\n"))
	parts := bytes.SplitN(lines[0], []byte(" "), 3)
	if len(parts) != 3 {
		return nil, errors.New("bad request line")
	}
	req := &request{method: string(parts[0]), path: string(parts[1])}
	length := 0
	for _, line := range lines[1:] {
		name, value, ok := bytes.Cut(line, []byte(":"))
		if !ok {
			continue
		}
		value = bytes.TrimSpace(value)
		switch {
		case bytes.EqualFold(name, []byte("content-length")):
			n, err := strconv.Atoi(string(value))
			if err != nil || n < 0 {
				return nil, errors.New("bad content-length")
			}
			length = n
		case bytes.EqualFold(name, []byte("connection")):
			req.close = bytes.EqualFold(value, []byte("close"))
		case bytes.EqualFold(name, []byte("transfer-encoding")):
			return nil, errors.New("chunked request bodies are not supported")
		}
	}
	start := end + 4
	for len(r.buf) < start+length {
		if err := r.fill(); err != nil {
			return nil, err
		}
	}
	req.body = append([]byte(nil), r.buf[start:start+length]...)
	r.buf = r.buf[:copy(r.buf, r.buf[start+length:])]
	return req, nil
}

func (r *reqReader) fill() error {
	if len(r.buf) == cap(r.buf) {
		r.buf = append(r.buf, make([]byte, cap(r.buf))...)[:len(r.buf)]
	}
	n, err := r.c.Read(r.buf[len(r.buf):cap(r.buf)])
	r.buf = r.buf[:len(r.buf)+n]
	if n > 0 {
		return nil
	}
	return err
}

func reply(status int, body string) []byte {
	reason := map[int]string{200: "OK", 404: "Not Found", 400: "Bad Request"}[status]
	return []byte(fmt.Sprintf("HTTP/1.1 %d %s\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s",
		status, reason, len(body), body))
}
