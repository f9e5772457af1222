package bech32

import (
	"bytes"
	"strings"
	"testing"
)

// BIP 173's valid and invalid checksums.
func TestVectors(t *testing.T) {
	for _, s := range []string{
		"A12UEL5L",
		"a12uel5l",
		"abcdef1qpzry9x8gf2tvdw0s3jn54khce6mua7lmqqqxw",
		"11qqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqqc8247j",
		"split1checkupstagehandshakeupstreamerranterredcaperred2y9e3w",
		"?1ezyfcl",
	} {
		if _, _, err := Decode(s); err != nil && !strings.Contains(err.Error(), "padding") {
			t.Errorf("Decode(%q): %v", s, err)
		}
	}
	for _, s := range []string{
		"\x201nwldj5",
		"pzry9x0s0muk",
		"1pzry9x0s0muk",
		"x1b4n0q5v",
		"li1dgmt3",
		"A1G7SGD8",
		"10a06t8",
		"1qzzfhee",
		"a12UEL5L",
		"a12uel5m",
	} {
		if _, _, err := Decode(s); err == nil {
			t.Errorf("Decode(%q) accepted an invalid string", s)
		}
	}
}

func TestRoundTrip(t *testing.T) {
	for n := 0; n <= 64; n++ {
		data := bytes.Repeat([]byte{byte(n * 7)}, n)
		s, err := Encode("age", data)
		if err != nil {
			t.Fatal(err)
		}
		hrp, got, err := Decode(s)
		if err != nil || hrp != "age" || !bytes.Equal(got, data) {
			t.Fatalf("%d bytes: %q -> %q %x %v", n, s, hrp, got, err)
		}
		// one character changed is caught
		b := []byte(s)
		i := len(b) - 1 - n%6
		if b[i] == 'q' {
			b[i] = 'p'
		} else {
			b[i] = 'q'
		}
		if _, _, err := Decode(string(b)); err == nil {
			t.Fatalf("%q accepted", b)
		}
	}
}
