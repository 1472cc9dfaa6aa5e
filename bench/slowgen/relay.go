package main

// The floor of a slow stream's relay: a byte-level TCP relay, one thread, one epoll loop,
// no HTTP. Each accepted connection gets its own connection to the backend, and what one
// side's read brings is written to the other side at once — a read and a write per chunk,
// the least any proxy does. bench/overload.py --floor runs it on the router's core, so the
// router's added TTFT and CPU per chunk can be read against what the kernel alone costs
// there (loopback: the sender's core also runs the receiver's TCP input and wakes it).

import (
	"flag"
	"fmt"
	"os"
	"runtime"
	"syscall"
	"unsafe"
)

func relayMain(args []string) {
	fs := flag.NewFlagSet("relay", flag.ExitOnError)
	port := fs.Int("port", 0, "port to listen on, 127.0.0.1 (0: a free one; printed on stdout)")
	to := fs.Int("to", 0, "the backend's port on 127.0.0.1")
	_ = fs.Parse(args)
	if *to <= 0 {
		fail("--to must be the backend's port")
	}
	runtime.LockOSThread()
	lfd, err := syscall.Socket(syscall.AF_INET, syscall.SOCK_STREAM|syscall.SOCK_NONBLOCK|syscall.SOCK_CLOEXEC, 0)
	if err != nil {
		fail("socket: %v", err)
	}
	_ = syscall.SetsockoptInt(lfd, syscall.SOL_SOCKET, syscall.SO_REUSEADDR, 1)
	if err := syscall.Bind(lfd, &syscall.SockaddrInet4{Port: *port, Addr: [4]byte{127, 0, 0, 1}}); err != nil {
		fail("bind: %v", err)
	}
	if err := syscall.Listen(lfd, 4096); err != nil {
		fail("listen: %v", err)
	}
	sa, _ := syscall.Getsockname(lfd)
	fmt.Fprintln(os.Stdout, sa.(*syscall.SockaddrInet4).Port)
	ep, err := syscall.EpollCreate1(syscall.EPOLL_CLOEXEC)
	if err != nil {
		fail("epoll: %v", err)
	}
	add := func(fd int) {
		ev := syscall.EpollEvent{Events: syscall.EPOLLIN, Fd: int32(fd)}
		if err := syscall.EpollCtl(ep, syscall.EPOLL_CTL_ADD, fd, &ev); err != nil {
			fail("epoll_ctl: %v", err)
		}
	}
	add(lfd)
	peer := map[int]int{}
	closePair := func(fd int) {
		other, ok := peer[fd]
		if !ok {
			return
		}
		delete(peer, fd)
		delete(peer, other)
		syscall.Close(fd)
		syscall.Close(other)
	}
	backend := &syscall.SockaddrInet4{Port: *to, Addr: [4]byte{127, 0, 0, 1}}
	events := make([]syscall.EpollEvent, 1024)
	buf := make([]byte, 65536)
	for {
		n, err := syscall.EpollWait(ep, events, -1)
		if err != nil {
			if err == syscall.EINTR {
				continue
			}
			fail("epoll_wait: %v", err)
		}
		for _, ev := range events[:n] {
			fd := int(ev.Fd)
			if fd == lfd {
				for {
					c, _, err := syscall.Accept4(lfd, syscall.SOCK_NONBLOCK|syscall.SOCK_CLOEXEC)
					if err != nil {
						break
					}
					b, err := dial(backend)
					if err != nil {
						syscall.Close(c)
						continue
					}
					_ = syscall.SetsockoptInt(c, syscall.IPPROTO_TCP, syscall.TCP_NODELAY, 1)
					peer[c], peer[b] = b, c
					add(c)
					add(b)
				}
				continue
			}
			other, ok := peer[fd]
			if !ok {
				continue
			}
			got, err := rawRead(fd, buf)
			if err == syscall.EAGAIN {
				continue
			}
			if got <= 0 || !writeAll(other, buf[:got]) {
				closePair(fd)
			}
		}
	}
}

// dial: a blocking connect (loopback: it completes at once), then non-blocking.
func dial(to *syscall.SockaddrInet4) (int, error) {
	fd, err := syscall.Socket(syscall.AF_INET, syscall.SOCK_STREAM|syscall.SOCK_CLOEXEC, 0)
	if err != nil {
		return -1, err
	}
	if err := syscall.Connect(fd, to); err != nil {
		syscall.Close(fd)
		return -1, err
	}
	_ = syscall.SetsockoptInt(fd, syscall.IPPROTO_TCP, syscall.TCP_NODELAY, 1)
	if err := syscall.SetNonblock(fd, true); err != nil {
		syscall.Close(fd)
		return -1, err
	}
	return fd, nil
}

// writeAll writes p, waiting (poll) while the socket is full: the floor's streams are slow,
// so this is the rare case, and the loop's other connections may wait for it.
func writeAll(fd int, p []byte) bool {
	for len(p) > 0 {
		n, err := rawWrite(fd, p)
		if err == syscall.EAGAIN {
			fds := []unixPollFd{{fd: int32(fd), events: 0x4}} // POLLOUT
			pollOnce(fds)
			continue
		}
		if err != nil || n <= 0 {
			return false
		}
		p = p[n:]
	}
	return true
}

type unixPollFd struct {
	fd      int32
	events  int16
	revents int16
}

// pollOnce blocks until one of fds is ready (poll(2), no timeout).
func pollOnce(fds []unixPollFd) {
	_, _, _ = syscall.Syscall(syscall.SYS_POLL, uintptr(unsafe.Pointer(&fds[0])), uintptr(len(fds)), ^uintptr(0))
}
