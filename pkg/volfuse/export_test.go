package volfuse

// For the tests' cleanup of a mount left stuck, and of fusectl.
var (
	IsMountPointForTest  = isMountPoint
	FuseMountConnForTest = fuseMountConn
	AbortConnForTest     = abortConn
)

const FusectlDirForTest = fusectlDir
