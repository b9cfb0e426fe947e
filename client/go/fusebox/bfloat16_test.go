// bfloat16 conversion: nearest even, NaN kept, exact widening.
package fusebox

import (
	"math"
	"testing"
)

func TestBFloat16RoundsToNearestEven(t *testing.T) {
	cases := []struct {
		in   uint32
		want uint16
	}{
		{0x3f800000, 0x3f80}, // 1.0 exactly
		{0x3f808000, 0x3f80}, // tie, even below
		{0x3f818000, 0x3f82}, // tie, even above
		{0x3f808001, 0x3f81}, // just past the tie
		{0x7f7fffff, 0x7f80}, // the largest float rounds to +inf
	}
	for _, c := range cases {
		if got := Float32ToBFloat16(math.Float32frombits(c.in)); got != c.want {
			t.Errorf("Float32ToBFloat16(%#x) = %#x, want %#x", c.in, got, c.want)
		}
	}
}

func TestBFloat16KeepsNaNAndWidensExactly(t *testing.T) {
	if b := Float32ToBFloat16(float32(math.NaN())); !math.IsNaN(float64(BFloat16ToFloat32(b))) {
		t.Errorf("NaN became %#x", b)
	}
	for b := 0; b < 1<<16; b++ {
		f := BFloat16ToFloat32(uint16(b))
		if math.IsNaN(float64(f)) {
			continue
		}
		if back := Float32ToBFloat16(f); back != uint16(b) {
			t.Fatalf("%#x widened to %g came back as %#x", b, f, back)
		}
	}
}
