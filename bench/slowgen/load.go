package main

// The client: `-streams` users, one keep-alive connection each (one event loop: user.go).
// User i sends its first request at i × ramp / N, then loops closed (the next request as
// soon as the previous one ended). Only requests *started* in the window count; the window
// opens `-warm` seconds after the ramp. TTFT runs from the request's write to the first
// read carrying a non-empty token. A stream is an error unless it is a 200 that ended
// cleanly with tokens + 1 lines, the last one `"done": true`.
//
// stdout: "start" and "end" as the window opens and closes (the caller's CPU snapshots),
// then one JSON line (see outcome).

import (
	"encoding/json"
	"flag"
	"fmt"
	"math"
	"net"
	"os"
	"sort"
	"strconv"
	"sync/atomic"
	"syscall"
	"time"
)

type loadConfig struct {
	ip                  net.IP
	port                int
	streams, tokens     int
	ramp, warm, seconds time.Duration
	timeout             time.Duration
	request             []byte
	t0, w0, w1          time.Time
	open                atomic.Int64 // streams open now
}

type record struct {
	sent float64 // s since t0
	ttft float64 // s; -1: no token came
	err  string
}

// outcome: what bench/overload.py reads (times in seconds).
type outcome struct {
	Requests    [][3]any   `json:"requests"` // [sent, ttft or null, error or null]
	SendLags    []float64  `json:"send_lags"`
	LoopLags    []float64  `json:"loop_lags"`
	OpenSamples []int64    `json:"open_samples"`
	Window      [2]float64 `json:"window"`
	CPUSeconds  float64    `json:"cpu_s"`
	WallSeconds float64    `json:"wall_s"`
	Lines       int        `json:"lines"`
	Bytes       int        `json:"nbytes"`
	records     []record
}

func loadMain(args []string) {
	fs := flag.NewFlagSet("load", flag.ExitOnError)
	host := fs.String("host", "127.0.0.1", "server host")
	port := fs.Int("port", 11434, "server port")
	streams := fs.Int("streams", 2000, "users (concurrent streams)")
	tokens := fs.Int("tokens", 100, "num_predict asked; a stream must carry tokens + 1 lines")
	ramp := fs.Float64("ramp", 4.05, "seconds over which the users send their first request")
	warm := fs.Float64("warm", 4.05, "seconds between the ramp's end and the window")
	seconds := fs.Float64("seconds", 60, "the measured window")
	timeout := fs.Float64("timeout", 60, "seconds a stream may take")
	_ = fs.Parse(args)
	if *streams <= 0 {
		fail("--streams must be > 0")
	}
	sec := func(v float64) time.Duration { return time.Duration(v * float64(time.Second)) }
	ip := net.ParseIP(*host).To4()
	if ip == nil {
		fail("--host must be an IPv4 address")
	}
	cfg := &loadConfig{ip: ip, port: *port, streams: *streams, tokens: *tokens,
		ramp: sec(*ramp), warm: sec(*warm), seconds: sec(*seconds), timeout: sec(*timeout)}
	cfg.request = requestBytes(*host, *port, *tokens)
	cfg.t0 = time.Now().Add(500 * time.Millisecond)
	cfg.w0 = cfg.t0.Add(cfg.ramp + cfg.warm)
	cfg.w1 = cfg.w0.Add(cfg.seconds)

	out := &outcome{Window: [2]float64{cfg.rel(cfg.w0), cfg.rel(cfg.w1)}}
	runLoop(cfg, out)
	for _, rec := range out.records {
		var ttft, err any
		if rec.ttft >= 0 {
			ttft = round6(rec.ttft)
		}
		if rec.err != "" {
			err = rec.err
		}
		out.Requests = append(out.Requests, [3]any{round6(rec.sent), ttft, err})
	}
	sort.Slice(out.Requests, func(a, b int) bool { return out.Requests[a][0].(float64) < out.Requests[b][0].(float64) })
	data, err := json.Marshal(out)
	if err != nil {
		fail("json: %v", err)
	}
	fmt.Fprintln(os.Stdout, string(data))
}

func (cfg *loadConfig) rel(t time.Time) float64 { return round6(t.Sub(cfg.t0).Seconds()) }

func round6(v float64) float64 { return math.Round(v*1e6) / 1e6 }

// requestBytes: bench/slowload.request_bytes, byte for byte.
func requestBytes(host string, port, tokens int) []byte {
	body := `{"model":"llama3","messages":[{"role":"user","content":"Why is the sky blue?"}],` +
		`"stream":true,"options":{"num_predict":` + strconv.Itoa(tokens) + `}}`
	return []byte(fmt.Sprintf("POST /api/chat HTTP/1.1\r\nHost: %s:%d\r\nContent-Type: application/json\r\n"+
		"Content-Length: %d\r\n\r\n%s", host, port, len(body), body))
}

func cpuSeconds() float64 {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return float64(ru.Utime.Nano()+ru.Stime.Nano()) / 1e9
}
