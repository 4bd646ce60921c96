package volfuse

// For the tests' cleanup of a mount left stuck.
var (
	FuseMountConnForTest = fuseMountConn
	AbortConnForTest     = abortConn
)
