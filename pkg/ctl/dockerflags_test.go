package ctl

import "testing"

func TestLongFileMountWarns(t *testing.T) {
	entry, ignored, err := longFileMount("secret", "source=pw,uid=1000,mode=0400")
	if err != nil || entry != "pw" || ignored != "--secret pw: uid=1000,mode=0400 ignored (the file is root's, mode 0444)" {
		t.Errorf("got %q, %q, %v", entry, ignored, err)
	}
	if _, ignored, _ := longFileMount("config", "source=c,uid=0,gid=0,mode=0444"); ignored != "" {
		t.Errorf("root's 0444 reported as ignored: %q", ignored)
	}
}
