package pki

import (
	"errors"
	"strings"
	"testing"

	"pgregory.net/rapid"
)

func TestTokenRoundTrip(t *testing.T) {
	ca := newCA(t, "c")
	tok, err := NewToken(ca)
	if err != nil {
		t.Fatalf("NewToken: %v", err)
	}
	if tok.Fingerprint != ca.Fingerprint() {
		t.Fatalf("token fingerprint %s, want the CA's %s", tok.Fingerprint, ca.Fingerprint())
	}
	if len(tok.Secret) != 52 || strings.ToLower(tok.Secret) != tok.Secret || strings.Contains(tok.Secret, "=") {
		t.Fatalf("secret %q: want 52 lowercase unpadded base32 characters", tok.Secret)
	}
	s := tok.String()
	if !strings.HasPrefix(s, "SHOAL-1-"+ca.Fingerprint()+"-") {
		t.Fatalf("token %q lacks the SHOAL-1-<fingerprint>- prefix", s)
	}
	got, err := ParseToken(s)
	if err != nil || got != tok {
		t.Fatalf("ParseToken(String()) = %+v, %v; want %+v", got, err, tok)
	}
	// Pasted tokens pick up whitespace and sometimes shouting.
	got, err = ParseToken("  " + strings.ToUpper(s) + "\n")
	if err != nil || got != tok {
		t.Fatalf("ParseToken(upper, padded) = %+v, %v; want %+v", got, err, tok)
	}
	tok2, _ := NewToken(ca)
	if tok2.Secret == tok.Secret {
		t.Fatalf("two tokens share a secret")
	}
}

func TestParseTokenRejects(t *testing.T) {
	fp := strings.Repeat("ab", 32)
	secret := strings.Repeat("a", 52)
	cases := []struct {
		name, in, want string
	}{
		{"empty", "", "empty"},
		{"blank", "   \n", "empty"},
		{"wrong prefix", "TOKEN-1-" + fp + "-" + secret, `does not start with "SHOAL-"`},
		{"no dashes", "SHOAL1" + fp + secret, `does not start with "SHOAL-"`},
		{"prefix only", "SHOAL", "missing version"},
		{"empty version", "SHOAL--" + fp + "-" + secret, "missing version"},
		{"future version", "SHOAL-2-" + fp + "-" + secret, `unsupported version "2"`},
		{"missing secret", "SHOAL-1-" + fp, "want 4 dash-separated fields"},
		{"extra field", "SHOAL-1-" + fp + "-" + secret + "-x", "want 4 dash-separated fields"},
		{"short fingerprint", "SHOAL-1-" + fp[:62] + "-" + secret, "64 hex digits, got 62"},
		{"long fingerprint", "SHOAL-1-" + fp + "00-" + secret, "64 hex digits, got 66"},
		{"non-hex fingerprint", "SHOAL-1-" + strings.Repeat("zz", 32) + "-" + secret, "not lowercase hexadecimal"},
		{"short secret", "SHOAL-1-" + fp + "-" + secret[:51], "52 base32 characters, got 51"},
		{"padded secret", "SHOAL-1-" + fp + "-" + secret[:48] + "====", "not valid base32"},
		{"non-base32 secret", "SHOAL-1-" + fp + "-" + strings.Repeat("1", 52), "not valid base32"},
		{"non-canonical secret", "SHOAL-1-" + fp + "-" + secret[:51] + "b", "not canonical"},
		{"empty secret", "SHOAL-1-" + fp + "-", "52 base32 characters, got 0"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, err := ParseToken(c.in)
			if err == nil {
				t.Fatalf("ParseToken(%q) succeeded", c.in)
			}
			if !errors.Is(err, ErrMalformedToken) {
				t.Fatalf("error %v does not wrap ErrMalformedToken", err)
			}
			if !strings.Contains(err.Error(), c.want) {
				t.Fatalf("error %q, want one containing %q", err, c.want)
			}
		})
	}
}

func TestParseTokenErrorsHideSecret(t *testing.T) {
	ca := newCA(t, "c")
	tok, _ := NewToken(ca)
	for _, bad := range []string{
		"SHOAL-1-" + tok.Fingerprint[:10] + "-" + tok.Secret,
		"SHOAL-1-" + tok.Fingerprint + "-" + tok.Secret + "x",
		"SHOAL-9-" + tok.Fingerprint + "-" + tok.Secret,
	} {
		_, err := ParseToken(bad)
		if err == nil {
			t.Fatalf("ParseToken(%q) succeeded", bad)
		}
		if strings.Contains(strings.ToLower(err.Error()), tok.Secret[:16]) {
			t.Fatalf("error quotes the secret: %v", err)
		}
	}
}

func TestHashSecret(t *testing.T) {
	ca := newCA(t, "c")
	tok, _ := NewToken(ca)
	other, _ := NewToken(ca)
	h := HashSecret(tok.Secret)
	if strings.Contains(h, tok.Secret) {
		t.Fatalf("stored hash contains the secret")
	}
	if !strings.HasPrefix(h, "sha256:") {
		t.Fatalf("hash %q lacks its scheme", h)
	}
	if !VerifySecret(tok.Secret, h) {
		t.Fatalf("VerifySecret rejects the right secret")
	}
	if !VerifySecret(strings.ToUpper(tok.Secret), h) {
		t.Fatalf("VerifySecret is case sensitive, but tokens are not")
	}
	if VerifySecret(other.Secret, h) {
		t.Fatalf("VerifySecret accepts another token's secret")
	}
	for _, bad := range []string{"", h, tok.Secret[:51]} {
		if VerifySecret(bad, h) && bad != tok.Secret {
			t.Fatalf("VerifySecret(%q) accepted", bad)
		}
	}
	if VerifySecret(tok.Secret, "") || VerifySecret(tok.Secret, h[:len(h)-1]) {
		t.Fatalf("VerifySecret accepts a damaged stored hash")
	}
}

func TestTokenProperties(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		fp := rapid.StringMatching(`[0-9a-f]{64}`).Draw(t, "fp")
		raw := rapid.SliceOfN(rapid.Byte(), 32, 32).Draw(t, "secret")
		tok := Token{Fingerprint: fp, Secret: strings.ToLower(secretEncoding.EncodeToString(raw))}
		got, err := ParseToken(tok.String())
		if err != nil || got != tok {
			t.Fatalf("ParseToken(%q) = %+v, %v", tok.String(), got, err)
		}
		if !VerifySecret(tok.Secret, HashSecret(got.Secret)) {
			t.Fatalf("VerifySecret fails on its own hash")
		}
	})
	rapid.Check(t, func(t *rapid.T) {
		s := rapid.String().Draw(t, "s")
		tok, err := ParseToken(s)
		if err != nil {
			if !errors.Is(err, ErrMalformedToken) {
				t.Fatalf("error %v does not wrap ErrMalformedToken", err)
			}
			return
		}
		if again, err := ParseToken(tok.String()); err != nil || again != tok {
			t.Fatalf("accepted %q but not its normal form", s)
		}
	})
}

func FuzzParseToken(f *testing.F) {
	f.Add("SHOAL-1-" + strings.Repeat("ab", 32) + "-" + strings.Repeat("a", 52))
	f.Add("SHOAL-1--")
	f.Add("shoal-1-x-y")
	f.Fuzz(func(t *testing.T, s string) {
		tok, err := ParseToken(s)
		if err != nil {
			if !errors.Is(err, ErrMalformedToken) {
				t.Fatalf("error %v does not wrap ErrMalformedToken", err)
			}
			return
		}
		if again, err := ParseToken(tok.String()); err != nil || again != tok {
			t.Fatalf("accepted %q but not its normal form", s)
		}
	})
}
