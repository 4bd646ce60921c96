// Command mkimage writes the busybox test images of package testimage as a
// tar that `shoalctl image load` (or `ctr image import`) reads.
//
//	go run ./pkg/testimage/cmd/mkimage -o /tmp/busybox.tar [-format oci|docker] [-v2] [-busybox /bin/busybox]
package main

import (
	"flag"
	"fmt"
	"os"

	"github.com/shoal-dev/shoal/pkg/testimage"
)

func main() {
	out := flag.String("o", "busybox.tar", "output file")
	format := flag.String("format", "oci", "archive format: oci (an OCI image layout) or docker (docker save)")
	v2 := flag.Bool("v2", false, "also add "+testimage.V2Name+" (the same base layer plus a layer of extra files)")
	onlyV2 := flag.Bool("only-v2", false, "write only "+testimage.V2Name)
	busybox := flag.String("busybox", testimage.DefaultBusybox, "static busybox binary to put in the image")
	name := flag.String("name", testimage.DefaultName, "name of the first image")
	flag.Parse()

	first := testimage.Default()
	first.Name = *name
	second := testimage.V2()
	var specs []testimage.Spec
	if !*onlyV2 {
		specs = append(specs, first)
	}
	if *v2 || *onlyV2 {
		specs = append(specs, second)
	}
	for i := range specs {
		specs[i].Busybox = *busybox
	}
	built, err := testimage.WriteFile(*out, *format, specs...)
	if err != nil {
		fmt.Fprintln(os.Stderr, "mkimage:", err)
		os.Exit(1)
	}
	for _, b := range built {
		fmt.Printf("%s\tconfig %s\tmanifest %s\n", b.Name, b.Config.Digest, b.Manifest.Digest)
	}
}
