"""kvq.k8s"""
