// bfloat16 <-> float32 as fusebox sends it: the upper 16 bits of a float32, little-endian,
// rounded to nearest even on the way down (NaN stays NaN), widened exactly on the way up.
package fusebox

import (
	"encoding/binary"
	"math"
)

// Float32ToBFloat16 rounds f to the nearest bfloat16 (ties to even); NaN stays a quiet NaN.
func Float32ToBFloat16(f float32) uint16 {
	u := math.Float32bits(f)
	if u&0x7fffffff > 0x7f800000 {
		return uint16(u>>16) | 0x40
	}
	return uint16((u + 0x7fff + ((u >> 16) & 1)) >> 16)
}

// BFloat16ToFloat32 widens a bfloat16 bit pattern to float32 (exact).
func BFloat16ToFloat32(b uint16) float32 {
	return math.Float32frombits(uint32(b) << 16)
}

// Float32Bytes is values as little-endian float32 bytes (DType FLOAT32's wire form).
func Float32Bytes(values []float32) []byte {
	out := make([]byte, 4*len(values))
	for i, v := range values {
		binary.LittleEndian.PutUint32(out[4*i:], math.Float32bits(v))
	}
	return out
}

// BFloat16Bytes is values rounded to bfloat16, as little-endian bytes (DType BFLOAT16's form).
func BFloat16Bytes(values []float32) []byte {
	out := make([]byte, 2*len(values))
	for i, v := range values {
		binary.LittleEndian.PutUint16(out[2*i:], Float32ToBFloat16(v))
	}
	return out
}

// Floats widens a tensor's bytes of dtype FLOAT32 or BFLOAT16 to float32 values (FLOAT16 too).
func Floats(t *Tensor) []float32 {
	switch t.DType {
	case Float32:
		out := make([]float32, len(t.Data)/4)
		for i := range out {
			out[i] = math.Float32frombits(binary.LittleEndian.Uint32(t.Data[4*i:]))
		}
		return out
	case BFloat16:
		out := make([]float32, len(t.Data)/2)
		for i := range out {
			out[i] = BFloat16ToFloat32(binary.LittleEndian.Uint16(t.Data[2*i:]))
		}
		return out
	case Float16:
		out := make([]float32, len(t.Data)/2)
		for i := range out {
			out[i] = halfToFloat32(binary.LittleEndian.Uint16(t.Data[2*i:]))
		}
		return out
	}
	return nil
}

// halfToFloat32 widens an IEEE binary16 bit pattern (exact).
func halfToFloat32(h uint16) float32 {
	sign := uint32(h>>15) << 31
	exp := uint32(h>>10) & 0x1f
	frac := uint32(h) & 0x3ff
	switch {
	case exp == 0x1f:
		return math.Float32frombits(sign | 0x7f800000 | frac<<13)
	case exp != 0:
		return math.Float32frombits(sign | (exp+112)<<23 | frac<<13)
	case frac == 0:
		return math.Float32frombits(sign)
	}
	// Subnormal: frac x 2^-24.
	v := float32(frac) * float32(math.Ldexp(1, -24))
	if sign != 0 {
		v = -v
	}
	return v
}
