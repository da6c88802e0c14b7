//go:build !linux

package netpoll

type sysPoller struct{}

type waitBuf struct{}

func (s *sysPoller) open() error                                { return ErrUnsupported }
func (s *sysPoller) add(int, uint64) error                      { return ErrUnsupported }
func (s *sysPoller) del(int)                                    {}
func (s *sysPoller) wait(_ *waitBuf, e []event) ([]event, bool) { return e, true }
func (s *sysPoller) wake()                                      {}
func (s *sysPoller) close() error                               { return nil }
func readFD(int, []byte) (int, error)                           { return 0, ErrUnsupported }
