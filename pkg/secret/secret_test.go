package secret

import (
	"bytes"
	"errors"
	"strings"
	"testing"
)

func key(b byte) []byte { return bytes.Repeat([]byte{b}, KeySize) }

func TestSealOpenRoundTrip(t *testing.T) {
	for _, data := range [][]byte{{}, []byte("hunter2"), bytes.Repeat([]byte{0xab}, MaxSize)} {
		s, err := Seal(key(1), "db-pass", data)
		if err != nil {
			t.Fatal(err)
		}
		if len(data) > 4 && bytes.Contains(s, data) {
			t.Fatalf("sealed value contains the plain text")
		}
		got, err := Open(key(1), "db-pass", s)
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(got, data) {
			t.Fatalf("Open = %q, want %q", got, data)
		}
	}
}

func TestSealsDiffer(t *testing.T) {
	a, _ := Seal(key(1), "x", []byte("same"))
	b, _ := Seal(key(1), "x", []byte("same"))
	if bytes.Equal(a, b) {
		t.Fatal("two seals of the same data are equal: the nonce is not random")
	}
}

func TestOpenRefuses(t *testing.T) {
	s, err := Seal(key(1), "db-pass", []byte("hunter2"))
	if err != nil {
		t.Fatal(err)
	}
	flipped := bytes.Clone(s)
	flipped[len(flipped)-1] ^= 1
	badVersion := bytes.Clone(s)
	badVersion[0] = 9
	for name, c := range map[string]struct {
		key    []byte
		name   string
		sealed []byte
	}{
		"other key":     {key(2), "db-pass", s},
		"other name":    {key(1), "db-pass2", s},
		"flipped bit":   {key(1), "db-pass", flipped},
		"other version": {key(1), "db-pass", badVersion},
		"truncated":     {key(1), "db-pass", s[:10]},
		"empty":         {key(1), "db-pass", nil},
	} {
		if _, err := Open(c.key, c.name, c.sealed); !errors.Is(err, ErrOpen) {
			t.Errorf("%s: Open err = %v, want ErrOpen", name, err)
		}
	}
	if _, err := Seal(key(1)[:16], "x", nil); err == nil {
		t.Error("Seal accepted a 16-byte key")
	}
}

func TestValidName(t *testing.T) {
	for _, ok := range []string{"a", "db-pass", "TLS_key.pem", "x9", strings.Repeat("a", 64)} {
		if err := ValidName(ok); err != nil {
			t.Errorf("ValidName(%q) = %v", ok, err)
		}
	}
	for _, bad := range []string{"", "-a", "a-", ".a", "a/b", "a b", "../x", strings.Repeat("a", 65), "é"} {
		if err := ValidName(bad); err == nil {
			t.Errorf("ValidName(%q) = nil", bad)
		}
	}
}

func TestRegistryName(t *testing.T) {
	for host, want := range map[string]string{
		"ghcr.io":              "registry.ghcr.io",
		"10.99.0.1:5000":       "registry.10.99.0.1_5000",
		"[fd00::1]:5000":       "registry.fd00__1__5000",
		"registry.example.com": "registry.registry.example.com",
	} {
		if got := RegistryName(host); got != want {
			t.Errorf("RegistryName(%q) = %q, want %q", host, got, want)
		}
	}
	long := strings.Repeat("a", 60) + ".example.com"
	if got := RegistryName(long); ValidName(got) != nil || len(got) > 64 || got == RegistryName(long+"x") {
		t.Errorf("RegistryName of a long host: %q", got)
	}
}
