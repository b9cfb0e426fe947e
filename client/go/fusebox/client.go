// Package fusebox is a Go client for fusebox.v1.KernelService: the four ops, uploads cut into
// chunks, downloads put back together, handles that free their tensors, bfloat16 conversion.
// The generated code it wraps (package fuseboxv1) comes from proto/fusebox/v1 with
// protoc-gen-go and protoc-gen-go-grpc; client/go/build.sh generates and builds it.
package fusebox

import (
	"context"
	"fmt"
	"io"
	"os"
	"sync"

	pb "fusebox/client/go/fuseboxv1"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/metadata"
)

// DType of a tensor on the wire.
type DType = pb.DType

// The dtypes fusebox computes in.
const (
	Float32  = pb.DType_FLOAT32
	Float16  = pb.DType_FLOAT16
	BFloat16 = pb.DType_BFLOAT16
)

// DefaultChunkBytes is the upload chunk size: 1-4 MiB is what the server handles best.
const DefaultChunkBytes = 4 << 20

// Tensor is row-major, little-endian bytes of one dtype and shape.
type Tensor struct {
	DType DType
	Shape []int64
	Data  []byte
}

// Input is an op argument: a tensor sent inline, or a handle the server holds.
type Input struct {
	Tensor *Tensor
	Handle string
}

// Inline passes t in the request itself.
func Inline(t *Tensor) Input { return Input{Tensor: t} }

// ByHandle passes a tensor the server already holds.
func ByHandle(h *Handle) Input { return Input{Handle: h.ID} }

// Client is a connection to one server; safe for concurrent use.
type Client struct {
	conn  *grpc.ClientConn
	stub  pb.KernelServiceClient
	token string

	mu   sync.Mutex
	live map[string]*Handle // handles this client made that still own their tensors
}

// Handle is a tensor the server holds. Free releases it; Client.Close frees every handle the
// client made that is still live; Release keeps the tensor past both.
type Handle struct {
	ID     string
	client *Client
}

// Options of Dial; empty fields come from the environment as the CLI reads it.
type Options struct {
	Target string // $FUSEBOX_SERVER, else localhost:50051; unix:/path works too
	Token  string // $FUSEBOX_TOKEN
	TLSCA  string // PEM file of the CA that signs the server's certificate ($FUSEBOX_TLS_CA)
}

// Dial connects (lazily, as gRPC does) to a fusebox server.
func Dial(o Options) (*Client, error) {
	if o.Target == "" {
		o.Target = os.Getenv("FUSEBOX_SERVER")
	}
	if o.Target == "" {
		o.Target = "localhost:50051"
	}
	if o.Token == "" {
		o.Token = os.Getenv("FUSEBOX_TOKEN")
	}
	if o.TLSCA == "" {
		o.TLSCA = os.Getenv("FUSEBOX_TLS_CA")
	}
	dial := []grpc.DialOption{grpc.WithDefaultCallOptions(
		grpc.MaxCallRecvMsgSize(1<<31-1), grpc.MaxCallSendMsgSize(1<<31-1))}
	if o.TLSCA != "" {
		creds, err := credentials.NewClientTLSFromFile(o.TLSCA, "")
		if err != nil {
			return nil, fmt.Errorf("fusebox: TLS CA %s: %w", o.TLSCA, err)
		}
		dial = append(dial, grpc.WithTransportCredentials(creds))
	} else {
		dial = append(dial, grpc.WithInsecure())
	}
	conn, err := grpc.Dial(o.Target, dial...)
	if err != nil {
		return nil, err
	}
	return &Client{conn: conn, stub: pb.NewKernelServiceClient(conn), token: o.Token,
		live: map[string]*Handle{}}, nil
}

// Stub is the generated client, for what this package does not wrap.
func (c *Client) Stub() pb.KernelServiceClient { return c.stub }

// Close frees the tensors of the handles this client made and still owns, then disconnects.
func (c *Client) Close() error {
	c.mu.Lock()
	live := c.live
	c.live = map[string]*Handle{}
	c.mu.Unlock()
	for id := range live {
		_, _ = c.stub.FreeTensor(c.ctx(context.Background(), id), &pb.FreeTensorRequest{Handle: id})
	}
	return c.conn.Close()
}

// ctx adds the call's metadata: the token, and what a call naming handles needs (the one
// place per-call headers are added).
func (c *Client) ctx(ctx context.Context, handles ...string) context.Context {
	_ = handles
	if c.token != "" {
		ctx = metadata.AppendToOutgoingContext(ctx, "authorization", "Bearer "+c.token)
	}
	return ctx
}

func (c *Client) own(id string) *Handle {
	h := &Handle{ID: id, client: c}
	c.mu.Lock()
	c.live[id] = h
	c.mu.Unlock()
	return h
}

// Free frees the handle's tensor (once; later calls return nil).
func (h *Handle) Free(ctx context.Context) error {
	c := h.client
	if c == nil {
		return nil
	}
	c.mu.Lock()
	_, owned := c.live[h.ID]
	delete(c.live, h.ID)
	c.mu.Unlock()
	if !owned {
		return nil
	}
	_, err := c.stub.FreeTensor(c.ctx(ctx, h.ID), &pb.FreeTensorRequest{Handle: h.ID})
	return err
}

// Release keeps the tensor on the server past Free and Close; it returns the handle's id.
func (h *Handle) Release() string {
	if c := h.client; c != nil {
		c.mu.Lock()
		delete(c.live, h.ID)
		c.mu.Unlock()
	}
	return h.ID
}

func (in Input) ref() *pb.TensorRef {
	if in.Tensor == nil {
		return &pb.TensorRef{Ref: &pb.TensorRef_Handle{Handle: in.Handle}}
	}
	t := in.Tensor
	return &pb.TensorRef{Ref: &pb.TensorRef_Tensor{Tensor: &pb.Tensor{
		Dtype: t.DType, Shape: t.Shape, Data: t.Data}}}
}

func handlesOf(ins ...Input) []string {
	var out []string
	for _, in := range ins {
		if in.Tensor == nil && in.Handle != "" {
			out = append(out, in.Handle)
		}
	}
	return out
}

// Result of an op: the output tensor, or with keep a handle to it; and the server's timing.
type Result struct {
	Output *Tensor
	Handle *Handle
	Timing *pb.Timing
}

func (c *Client) result(out *pb.TensorRef, timing *pb.Timing) (*Result, error) {
	r := &Result{Timing: timing}
	switch ref := out.GetRef().(type) {
	case *pb.TensorRef_Handle:
		r.Handle = c.own(ref.Handle)
	case *pb.TensorRef_Tensor:
		r.Output = &Tensor{DType: ref.Tensor.Dtype, Shape: ref.Tensor.Shape, Data: ref.Tensor.Data}
	default:
		return nil, fmt.Errorf("fusebox: the response has no output")
	}
	return r, nil
}

// Gelu is tanh-form GeLU, elementwise; keep leaves the output on the server.
func (c *Client) Gelu(ctx context.Context, x Input, keep bool) (*Result, error) {
	resp, err := c.stub.Gelu(c.ctx(ctx, handlesOf(x)...), &pb.GeluRequest{Input: x.ref(),
		OutputOptions: &pb.OutputOptions{KeepOnServer: keep}})
	if err != nil {
		return nil, err
	}
	return c.result(resp.Output, resp.Timing)
}

// Softmax is over the last axis (rank >= 1).
func (c *Client) Softmax(ctx context.Context, x Input, keep bool) (*Result, error) {
	resp, err := c.stub.Softmax(c.ctx(ctx, handlesOf(x)...), &pb.SoftmaxRequest{Input: x.ref(),
		OutputOptions: &pb.OutputOptions{KeepOnServer: keep}})
	if err != nil {
		return nil, err
	}
	return c.result(resp.Output, resp.Timing)
}

// RowSum sums over the last axis (rank >= 1); the output is FLOAT32.
func (c *Client) RowSum(ctx context.Context, x Input, keep bool) (*Result, error) {
	resp, err := c.stub.RowSum(c.ctx(ctx, handlesOf(x)...), &pb.RowSumRequest{Input: x.ref(),
		OutputOptions: &pb.OutputOptions{KeepOnServer: keep}})
	if err != nil {
		return nil, err
	}
	return c.result(resp.Output, resp.Timing)
}

// MatmulRelu is relu(a b + bias); bias may be nil.
func (c *Client) MatmulRelu(ctx context.Context, a, b Input, bias *Input, keep bool) (*Result, error) {
	req := &pb.MatmulReluRequest{A: a.ref(), B: b.ref(),
		OutputOptions: &pb.OutputOptions{KeepOnServer: keep}}
	ins := []Input{a, b}
	if bias != nil {
		req.Bias = bias.ref()
		ins = append(ins, *bias)
	}
	resp, err := c.stub.MatmulRelu(c.ctx(ctx, handlesOf(ins...)...), req)
	if err != nil {
		return nil, err
	}
	return c.result(resp.Output, resp.Timing)
}

// List is what this caller holds on the server.
func (c *Client) List(ctx context.Context) ([]*pb.TensorInfo, error) {
	resp, err := c.stub.ListTensors(c.ctx(ctx), &pb.ListTensorsRequest{})
	if err != nil {
		return nil, err
	}
	return resp.Tensors, nil
}

// Upload streams t to the server in chunks of chunkBytes (0: DefaultChunkBytes); the header
// travels with the first chunk. The returned handle owns the tensor.
func (c *Client) Upload(ctx context.Context, t *Tensor, chunkBytes int) (*Handle, error) {
	if chunkBytes <= 0 {
		chunkBytes = DefaultChunkBytes
	}
	stream, err := c.stub.Upload(c.ctx(ctx))
	if err != nil {
		return nil, err
	}
	for off := 0; off == 0 || off < len(t.Data); off += chunkBytes {
		end := off + chunkBytes
		if end > len(t.Data) {
			end = len(t.Data)
		}
		msg := &pb.UploadRequest{Data: t.Data[off:end]}
		if off == 0 {
			msg.Dtype, msg.Shape = t.DType, t.Shape
		}
		if err := stream.Send(msg); err != nil {
			break // the server ended the call: CloseAndRecv says why
		}
		if end == len(t.Data) {
			break
		}
	}
	resp, err := stream.CloseAndRecv()
	if err != nil {
		return nil, err
	}
	return c.own(resp.Tensor.Handle), nil
}

// Download fetches a held tensor, its chunks put back together in one buffer.
func (c *Client) Download(ctx context.Context, h string) (*Tensor, error) {
	stream, err := c.stub.Download(c.ctx(ctx, h), &pb.DownloadRequest{Handle: h})
	if err != nil {
		return nil, err
	}
	var t *Tensor
	for {
		msg, err := stream.Recv()
		if err == io.EOF {
			break
		}
		if err != nil {
			return nil, err
		}
		if t == nil {
			info := msg.GetTensor()
			if info == nil {
				return nil, fmt.Errorf("fusebox: the download carried no tensor header")
			}
			t = &Tensor{DType: info.Dtype, Shape: info.Shape,
				Data: make([]byte, 0, info.SizeBytes)}
		}
		t.Data = append(t.Data, msg.Data...)
	}
	if t == nil {
		return nil, fmt.Errorf("fusebox: the download carried no tensor header")
	}
	return t, nil
}
