// Placeholder translation unit: the runtime (communicators, ring attention, codec) lands here.
namespace dynacp::runtime {}
