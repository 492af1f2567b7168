// Shared by every OpenCL kernel file. A pointer argument is a buffer and a byte offset into it
// (the backend maps tandem's device addresses to them): PTR declares the pair, AT makes the
// typed pointer.
#define PTR(name) __global uchar *name##_b, ulong name##_o
#define AT(T, name) ((__global T *)(name##_b + name##_o))
