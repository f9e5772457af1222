// Package bech32 checks and decodes Bech32 strings (BIP 173), the form of
// an age public key ("age1..."). It exists so that pkg/trust can hold a
// host's sealing key to its grammar and checksum — a typo in a pasted
// trust line is caught when it is added — without linking filippo.io/age
// into every short command that reads the trust file.
package bech32

import (
	"errors"
	"strings"
)

const charset = "qpzry9x8gf2tvdw0s3jn54khce6mua7l"

var gen = [5]uint32{0x3b6a57b2, 0x26508e6d, 0x1ea119fa, 0x3d4233dd, 0x2a1462b3}

func polymod(values []byte) uint32 {
	chk := uint32(1)
	for _, v := range values {
		top := chk >> 25
		chk = (chk&0x1ffffff)<<5 ^ uint32(v)
		for i := 0; i < 5; i++ {
			if (top>>uint(i))&1 == 1 {
				chk ^= gen[i]
			}
		}
	}
	return chk
}

func hrpExpand(hrp string) []byte {
	out := make([]byte, 0, 2*len(hrp)+1)
	for i := 0; i < len(hrp); i++ {
		out = append(out, hrp[i]>>5)
	}
	out = append(out, 0)
	for i := 0; i < len(hrp); i++ {
		out = append(out, hrp[i]&31)
	}
	return out
}

// Decode checks s (all lower or all upper case, checksum valid) and
// returns its human-readable part, lower-cased, and its data as bytes.
// Unlike BIP 173 it allows strings longer than 90 characters, as age does.
func Decode(s string) (hrp string, data []byte, err error) {
	if strings.ToLower(s) != s && strings.ToUpper(s) != s {
		return "", nil, errors.New("mixed case")
	}
	s = strings.ToLower(s)
	pos := strings.LastIndexByte(s, '1')
	if pos < 1 || pos+7 > len(s) {
		return "", nil, errors.New("no separator, or too short")
	}
	hrp = s[:pos]
	for i := 0; i < len(hrp); i++ {
		if hrp[i] < 33 || hrp[i] > 126 {
			return "", nil, errors.New("invalid character in the prefix")
		}
	}
	vals := make([]byte, 0, len(s)-pos-1)
	for i := pos + 1; i < len(s); i++ {
		d := strings.IndexByte(charset, s[i])
		if d < 0 {
			return "", nil, errors.New("invalid character")
		}
		vals = append(vals, byte(d))
	}
	if polymod(append(hrpExpand(hrp), vals...)) != 1 {
		return "", nil, errors.New("bad checksum")
	}
	data, err = convert(vals[:len(vals)-6], 5, 8, false)
	return hrp, data, err
}

// Encode returns hrp and data as a lower-case Bech32 string.
func Encode(hrp string, data []byte) (string, error) {
	hrp = strings.ToLower(hrp)
	vals, err := convert(data, 8, 5, true)
	if err != nil {
		return "", err
	}
	chk := polymod(append(append(hrpExpand(hrp), vals...), 0, 0, 0, 0, 0, 0)) ^ 1
	var b strings.Builder
	b.WriteString(hrp)
	b.WriteByte('1')
	for _, v := range vals {
		b.WriteByte(charset[v])
	}
	for i := 0; i < 6; i++ {
		b.WriteByte(charset[(chk>>uint(5*(5-i)))&31])
	}
	return b.String(), nil
}

// convert regroups bits from groups of from to groups of to.
func convert(data []byte, from, to uint, pad bool) ([]byte, error) {
	var acc uint32
	var bits uint
	maxv := uint32(1)<<to - 1
	out := make([]byte, 0, len(data)*int(from)/int(to)+1)
	for _, v := range data {
		if uint32(v)>>from != 0 {
			return nil, errors.New("invalid data")
		}
		acc = acc<<from | uint32(v)
		bits += from
		for bits >= to {
			bits -= to
			out = append(out, byte(acc>>bits&maxv))
		}
	}
	if pad {
		if bits > 0 {
			out = append(out, byte(acc<<(to-bits)&maxv))
		}
	} else if bits >= from || acc<<(to-bits)&maxv != 0 {
		return nil, errors.New("invalid padding")
	}
	return out, nil
}
