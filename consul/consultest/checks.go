package consultest

import "github.com/hashicorp/consul/api"

// RegisterCheck registers someone else's check on node, as an operator or
// another tool would through the catalog API: under serviceID, or on the
// node itself when serviceID is "". The node's record (its meta) is kept.
func (s *Server) RegisterCheck(node, checkID, serviceID, status string) error {
	_, err := s.Client().Catalog().Register(&api.CatalogRegistration{Node: node, Address: "127.0.0.1", SkipNodeUpdate: true,
		Check: &api.AgentCheck{Node: node, CheckID: checkID, Name: checkID, ServiceID: serviceID, Status: status}}, nil)
	return err
}

// DeregisterCheck removes check checkID from node.
func (s *Server) DeregisterCheck(node, checkID string) error {
	_, err := s.Client().Catalog().Deregister(&api.CatalogDeregistration{Node: node, CheckID: checkID}, nil)
	return err
}
