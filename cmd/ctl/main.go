// Command shoalctl is Shoal's command-line interface: see package ctl.
package main

import (
	"os"

	"github.com/shoal-dev/shoal/pkg/ctl"
)

func main() { os.Exit(ctl.Main(os.Args[1:])) }
