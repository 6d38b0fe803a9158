"""betaprm"""
