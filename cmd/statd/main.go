// Command shoal-statd: see package statd.
package main

import (
	"os"

	"github.com/shoal-dev/shoal/pkg/statd"
)

func main() { os.Exit(statd.Main(os.Args[1:])) }
