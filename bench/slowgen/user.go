package main

// The client's event loop: one thread, one edge-triggered epoll set, one read(2) per chunk
// that arrives (net.Conn's goroutines cost a second read that finds nothing per chunk, and
// 2.4 µs of scheduling). It also keeps the timers: the ramp, the
// window's marks, the 10 ms lag probe and the streams' timeouts.

import (
	"fmt"
	"os"
	"strconv"
	"syscall"
	"time"
)

const epollInET = syscall.EPOLLIN | uint32(1)<<31 // EPOLLET

type user struct {
	fd         int // -1: no connection
	connecting bool
	open       bool // its stream is counted in cfg.open
	plan, sent time.Time
	ttft       time.Duration
	p          respParser
}

type loop struct {
	cfg     *loadConfig
	out     *outcome
	ep      int
	users   []user
	byFd    map[int]*user
	started int // users whose first request went out
	running int // users not finished
	buf     []byte
	addr    syscall.SockaddrInet4
	probe   time.Time // when the lag probe is due
	k       int
	cpu0    float64
	wall0   time.Time
	inWin   bool
}

func runLoop(cfg *loadConfig, out *outcome) {
	ep, err := syscall.EpollCreate1(syscall.EPOLL_CLOEXEC)
	if err != nil {
		fail("epoll: %v", err)
	}
	l := &loop{cfg: cfg, out: out, ep: ep, users: make([]user, cfg.streams), byFd: map[int]*user{},
		running: cfg.streams, buf: make([]byte, 64<<10), addr: syscall.SockaddrInet4{Port: cfg.port}}
	copy(l.addr.Addr[:], cfg.ip.To4())
	for i := range l.users {
		u := &l.users[i]
		u.fd = -1
		u.plan = cfg.t0.Add(time.Duration(int64(cfg.ramp) * int64(i) / int64(cfg.streams)))
		u.p = respParser{line: make([]byte, 0, 256), tail: make([]byte, 0, 512)}
	}
	events := make([]syscall.EpollEvent, 1024)
	nextScan := time.Now().Add(time.Second)
	for l.running > 0 {
		now := time.Now()
		for l.started < len(l.users) && !l.users[l.started].plan.After(now) {
			l.send(&l.users[l.started], now)
			l.started++
		}
		l.marks(now)
		if !now.Before(nextScan) {
			l.expire(now)
			nextScan = now.Add(time.Second)
		}
		n, err := rawEpollWait(ep, events, l.wait(time.Now(), nextScan))
		if err != nil && err != syscall.EINTR {
			fail("epoll_wait: %v", err)
		}
		for _, ev := range events[:max(n, 0)] {
			if u := l.byFd[int(ev.Fd)]; u != nil {
				l.ready(u, ev.Events)
			}
		}
	}
}

// wait: ms to the next timer (rounded up: never early), at most 10.
func (l *loop) wait(now, nextScan time.Time) int {
	next := nextScan
	if l.started < len(l.users) && l.users[l.started].plan.Before(next) {
		next = l.users[l.started].plan
	}
	if l.inWin || l.out.CPUSeconds == 0 && now.Before(l.cfg.w1) {
		if due := l.nextProbe(); due.Before(next) {
			next = due
		}
	}
	d := next.Sub(now)
	if d <= 0 {
		return 0
	}
	return min(int((d+time.Millisecond-1)/time.Millisecond), 10)
}

func (l *loop) nextProbe() time.Time {
	if !l.inWin {
		return l.cfg.w0
	}
	return l.probe
}

// marks: the window's start and end, and inside it the lag probe (how late a 10 ms timer
// fires) and the open streams every 100 ms.
func (l *loop) marks(now time.Time) {
	cfg, out := l.cfg, l.out
	if !l.inWin && out.CPUSeconds == 0 && !now.Before(cfg.w0) {
		l.inWin, l.cpu0, l.wall0, l.probe = true, cpuSeconds(), now, now.Add(10*time.Millisecond)
		fmt.Fprintln(os.Stdout, "start")
		return
	}
	if !l.inWin || now.Before(l.probe) {
		return
	}
	out.LoopLags = append(out.LoopLags, round6(now.Sub(l.probe).Seconds()))
	if l.k++; l.k%10 == 0 {
		out.OpenSamples = append(out.OpenSamples, cfg.open.Load())
	}
	l.probe = now.Add(10 * time.Millisecond)
	if !now.Before(cfg.w1) {
		l.inWin = false
		out.CPUSeconds, out.WallSeconds = round6(cpuSeconds()-l.cpu0), round6(now.Sub(l.wall0).Seconds())
		fmt.Fprintln(os.Stdout, "end")
	}
}

// send: the user's next request, on its connection (a new one if it has none).
func (l *loop) send(u *user, now time.Time) {
	u.p.reset()
	u.ttft = -1
	if u.fd < 0 {
		if err := l.connect(u); err != nil {
			u.sent = now
			l.finish(u, "connect", now)
			return
		}
		if u.connecting {
			return // the request goes out once the connection is up
		}
	}
	u.sent = time.Now()
	l.out.SendLags = append(l.out.SendLags, round6(u.sent.Sub(u.plan).Seconds()))
	l.cfg.open.Add(1)
	u.open = true
	if _, err := rawWrite(u.fd, l.cfg.request); err != nil {
		l.finish(u, "connection", u.sent)
	}
}

func (l *loop) connect(u *user) error {
	fd, err := syscall.Socket(syscall.AF_INET, syscall.SOCK_STREAM|syscall.SOCK_NONBLOCK|syscall.SOCK_CLOEXEC, 0)
	if err != nil {
		return err
	}
	_ = syscall.SetsockoptInt(fd, syscall.IPPROTO_TCP, syscall.TCP_NODELAY, 1)
	err = syscall.Connect(fd, &l.addr)
	u.connecting = err == syscall.EINPROGRESS
	if err != nil && !u.connecting {
		syscall.Close(fd)
		return err
	}
	ev := syscall.EpollEvent{Events: epollInET, Fd: int32(fd)}
	if u.connecting {
		ev.Events |= syscall.EPOLLOUT
	}
	if err := syscall.EpollCtl(l.ep, syscall.EPOLL_CTL_ADD, fd, &ev); err != nil {
		syscall.Close(fd)
		return err
	}
	u.fd = fd
	l.byFd[fd] = u
	return nil
}

func (l *loop) ready(u *user, events uint32) {
	if u.connecting {
		now := time.Now()
		if soErr, _ := syscall.GetsockoptInt(u.fd, syscall.SOL_SOCKET, syscall.SO_ERROR); soErr != 0 {
			u.sent = now
			l.finish(u, "connect", now)
			return
		}
		u.connecting = false
		ev := syscall.EpollEvent{Events: epollInET, Fd: int32(u.fd)}
		_ = syscall.EpollCtl(l.ep, syscall.EPOLL_CTL_MOD, u.fd, &ev)
		l.send(u, now)
		return
	}
	for { // edge-triggered: read until a read comes back short (the socket is then empty)
		n, err := rawRead(u.fd, l.buf)
		now := time.Now()
		if err == syscall.EAGAIN || err == syscall.EINTR {
			return
		}
		if n <= 0 {
			l.finish(u, "connection", now)
			return
		}
		if !l.consume(u, l.buf[:n], now) || n < len(l.buf) {
			return
		}
	}
}

// consume feeds one read to the user's stream; false once the stream ended or failed.
func (l *loop) consume(u *user, data []byte, now time.Time) bool {
	if u.sent.IsZero() {
		return false // bytes nobody asked for
	}
	if _, err := u.p.feed(data); err != nil {
		l.finish(u, "protocol", now)
		return false
	}
	if u.p.lastToken {
		u.ttft = now.Sub(u.sent)
	}
	if u.p.done() {
		kind := ""
		switch {
		case u.p.status != 200:
			kind = "http_" + strconv.Itoa(u.p.status)
		case u.p.lines != l.cfg.tokens+1 || !u.p.finalDone():
			kind = "short"
		}
		l.finish(u, kind, now)
		return false
	}
	return true
}

// finish records the user's stream and sends the next one now (closed loop) or ends.
func (l *loop) finish(u *user, kind string, now time.Time) {
	if u.open {
		l.cfg.open.Add(-1)
		u.open = false
	}
	if !u.sent.Before(l.cfg.w0) && u.sent.Before(l.cfg.w1) {
		t := -1.0
		if u.ttft >= 0 {
			t = u.ttft.Seconds()
		}
		l.out.records = append(l.out.records, record{sent: l.cfg.rel(u.sent), ttft: t, err: kind})
		l.out.Lines += u.p.lines
		l.out.Bytes += u.p.nbytes
	}
	cut := !u.p.done() || u.p.close
	if u.fd >= 0 && (cut || !now.Before(l.cfg.w1)) {
		delete(l.byFd, u.fd)
		syscall.Close(u.fd)
		u.fd = -1
	}
	u.sent = time.Time{}
	u.plan = now
	if kind == "connect" || !now.Before(l.cfg.w1) { // (a user that cannot connect stops)
		l.running--
		return
	}
	l.send(u, now)
}

// expire cuts the streams that ran past their timeout.
func (l *loop) expire(now time.Time) {
	for i := range l.users {
		u := &l.users[i]
		if !u.sent.IsZero() && now.Sub(u.sent) > l.cfg.timeout {
			l.finish(u, "timeout", now)
		}
	}
}
