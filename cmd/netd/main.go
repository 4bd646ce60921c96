// Command shoal-netd: see package netd.
package main

import (
	"os"

	"github.com/shoal-dev/shoal/pkg/netd"
)

func main() { os.Exit(netd.Main(os.Args[1:])) }
