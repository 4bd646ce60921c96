// Command shoal-vold: see package vold.
package main

import (
	"os"

	"github.com/shoal-dev/shoal/pkg/vold"
)

func main() { os.Exit(vold.Main(os.Args[1:])) }
