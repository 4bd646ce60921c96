// Command shoal-schedd: see package schedd.
package main

import (
	"os"

	"github.com/shoal-dev/shoal/pkg/schedd"
)

func main() { os.Exit(schedd.Main(os.Args[1:])) }
