package main

// System calls without the Go scheduler's bookkeeping (entersyscall/exitsyscall, and
// sysmon handing the P to another thread while one blocks): the load side's threads do
// nothing else, and these calls are the whole per-chunk cost. Only for calls that do not
// block (non-blocking sockets), and for epoll_wait with a timeout of at most 10 ms.

import (
	"syscall"
	"unsafe"
)

func rawRead(fd int, p []byte) (int, error) {
	n, _, e := syscall.RawSyscall(syscall.SYS_READ, uintptr(fd), uintptr(unsafe.Pointer(&p[0])), uintptr(len(p)))
	if e != 0 {
		return -1, e
	}
	return int(n), nil
}

func rawWrite(fd int, p []byte) (int, error) {
	n, _, e := syscall.RawSyscall(syscall.SYS_WRITE, uintptr(fd), uintptr(unsafe.Pointer(&p[0])), uintptr(len(p)))
	if e != 0 {
		return -1, e
	}
	return int(n), nil
}

func rawEpollWait(ep int, events []syscall.EpollEvent, msec int) (int, error) {
	n, _, e := syscall.RawSyscall6(syscall.SYS_EPOLL_WAIT, uintptr(ep), uintptr(unsafe.Pointer(&events[0])),
		uintptr(len(events)), uintptr(msec), 0, 0)
	if e != 0 {
		return 0, e
	}
	return int(n), nil
}
