// Example: the fusebox Go client against a running server ($FUSEBOX_SERVER, else
// localhost:50051): GeLU inline in bfloat16, an upload of 10 MiB in chunks, softmax by handle
// with the output kept, a download, and every handle freed. Exits 1 on any mismatch.
package main

import (
	"context"
	"fmt"
	"math"
	"os"
	"time"

	"fusebox/client/go/fusebox"
)

func check(err error, what string) {
	if err != nil {
		fmt.Fprintf(os.Stderr, "example: %s: %v\n", what, err)
		os.Exit(1)
	}
}

func gelu(x float64) float64 {
	return 0.5 * x * (1 + math.Tanh(math.Sqrt(2/math.Pi)*(x+0.044715*x*x*x)))
}

func main() {
	c, err := fusebox.Dial(fusebox.Options{})
	check(err, "dial")
	defer c.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()

	// GeLU in bfloat16: rounded on the client, widened exactly on the way back.
	xs := []float32{-3, -1, -0.5, 0, 0.5, 1, 3, 7.25}
	r, err := c.Gelu(ctx, fusebox.Inline(&fusebox.Tensor{DType: fusebox.BFloat16,
		Shape: []int64{int64(len(xs))}, Data: fusebox.BFloat16Bytes(xs)}), false)
	check(err, "gelu")
	got := fusebox.Floats(r.Output)
	for i, x := range xs {
		want := gelu(float64(fusebox.BFloat16ToFloat32(fusebox.Float32ToBFloat16(x))))
		if math.Abs(float64(got[i])-want) > 1.6e-2*math.Max(1, math.Abs(want)) {
			fmt.Fprintf(os.Stderr, "example: gelu(%g) = %g, want %g\n", x, got[i], want)
			os.Exit(1)
		}
	}
	fmt.Printf("gelu bfloat16 %v -> %v (%s, kernel %.0f us)\n", xs, got, r.Timing.Backend,
		r.Timing.KernelUs)

	// 10 MiB uploaded in 1 MiB chunks, softmax kept on the server, then downloaded.
	const rows, cols = 640, 4096
	big := make([]float32, rows*cols)
	for i := range big {
		big[i] = float32(i%cols) / cols
	}
	h, err := c.Upload(ctx, &fusebox.Tensor{DType: fusebox.Float32, Shape: []int64{rows, cols},
		Data: fusebox.Float32Bytes(big)}, 1<<20)
	check(err, "upload")
	s, err := c.Softmax(ctx, fusebox.ByHandle(h), true)
	check(err, "softmax")
	out, err := c.Download(ctx, s.Handle.ID)
	check(err, "download")
	vals := fusebox.Floats(out)
	for row := 0; row < rows; row += rows - 1 {
		sum := 0.0
		for _, v := range vals[row*cols : (row+1)*cols] {
			sum += float64(v)
		}
		if math.Abs(sum-1) > 1e-4 {
			fmt.Fprintf(os.Stderr, "example: softmax row %d sums to %g\n", row, sum)
			os.Exit(1)
		}
	}
	fmt.Printf("softmax of a %dx%d upload by handle: rows sum to 1, %d bytes downloaded\n",
		rows, cols, len(out.Data))

	check(h.Free(ctx), "free upload")
	check(s.Handle.Free(ctx), "free softmax")
	held, err := c.List(ctx)
	check(err, "list")
	for _, t := range held {
		if t.Handle == h.ID || t.Handle == s.Handle.ID {
			fmt.Fprintf(os.Stderr, "example: %s is still held after Free\n", t.Handle)
			os.Exit(1)
		}
	}
	fmt.Println("both handles freed")
}
