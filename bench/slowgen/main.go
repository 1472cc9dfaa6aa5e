// Command slowgen is the compiled load side of bench/overload.py: thousands of slow
// streams without the load side being the limit of the measurement.
//
//	slowgen serve [flags]   a fake Ollama backend serving /api/chat streams like mock/
//	slowgen load [flags]    N users, one keep-alive connection each; JSON results on stdout
//	slowgen relay [flags]   a byte-level TCP relay: the floor any proxy's relay costs
//
// It is for that benchmark only: mock/ stays the project's test backend.
package main

import (
	"fmt"
	"os"
)

func main() {
	if len(os.Args) < 2 {
		usage()
	}
	switch os.Args[1] {
	case "serve":
		serveMain(os.Args[2:])
	case "load":
		loadMain(os.Args[2:])
	case "relay":
		relayMain(os.Args[2:])
	default:
		usage()
	}
}

func usage() {
	fmt.Fprintln(os.Stderr, "usage: slowgen serve|load|relay [flags] (-h for the flags)")
	os.Exit(2)
}

func fail(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "slowgen: "+format+"\n", args...)
	os.Exit(1)
}
